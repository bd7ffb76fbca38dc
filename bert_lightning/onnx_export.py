"""A model as it is used (a fine-tuned head, or an embedding model with its pooling) written
as an ONNX folder (optionally int8) that `ort.py` runs: `bert-lightning export-onnx`, and the
benchmarks and tests that export."""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from bert_lightning.atomic import atomic_path
from bert_lightning.catalogue import encoder_fingerprint
from bert_lightning.checkpoint import FINETUNING, read_checkpoint
from bert_lightning.choices import EXPORT_POOLING
from bert_lightning.errors import UserError
from bert_lightning.inference import load_embedder, load_finetuned, pooling_of
from bert_lightning.model.heads import BertBiEncoder
from bert_lightning.ort import INPUTS, SPEC, BiEncoderSide, Embedder, onnx_runtime

OPSET = 18


def export_onnx(
    path, out_dir, *, quantize: str | None, pooling: str | None, max_seq_length: int | None,
    overwrite: bool, fp32_top: int = 0,
) -> Path:  # fmt: skip
    """Writes `out_dir` whole or not at all. `pooling`, `max_seq_length`: of an embedding model
    (a fine-tuned model keeps its own head and length); None: a sentence-transformers folder's
    own (`inference.Declared`, its Normalize too; another pooling is refused), else
    `EXPORT_POOLING` and `load_embedder`'s length. `fp32_top`: with int8, the top layers (and
    the pooler and head above them) left in fp32, where a score's error grows most."""
    onnx_runtime()
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise UserError(f"{out_dir} exists; choose a new folder (or --overwrite)")
    pre = read_checkpoint(path)
    L = pre.config.num_hidden_layers
    if fp32_top and (quantize != "int8" or not 0 < fp32_top <= L):
        raise UserError(
            f"--fp32-top {fp32_top}: needs --quantize int8 and at most the model's {L} layers"
        )
    if pre.origin == FINETUNING:
        given = {"--pooling": pooling, "--max-seq-length": max_seq_length}
        if ignored := [f"{k} {v}" for k, v in given.items() if v is not None]:
            raise UserError(
                f"{' '.join(ignored)}: {path} is fine-tuned, exported with the pooling and "
                "length it was fine-tuned with; leave them out"
            )
        ft = load_finetuned(path, "export-onnx", pre)
        model, tok_json, length = ft.model, ft.tokenizer_json, ft.max_seq_length
        spec = {"use": "finetuned", "task": asdict(ft.task.cfg)}
        if isinstance(model, BertBiEncoder):  # the encoder; the cosine and its head run around
            spec |= {"head": "bi_encoder", "pooling": model.pooling}
            spec["classifier"] = [model.classifier.weight.item(), model.classifier.bias.item()]
            spec["encoder"] = encoder_fingerprint(ft, path)  # a catalogue index's encoder
            model, output = BiEncoderSide(model), "embeddings"
        else:
            spec["head"], output = "logits", "logits"
    else:
        encoder, tok = load_embedder(path, max_seq_length, pre)
        declared = encoder.declared  # a sentence-transformers folder's pooling and Normalize
        if declared is None:
            pooling, normalize = pooling or EXPORT_POOLING, False
        else:  # another pooling asked is refused
            pooling, normalize = pooling_of(encoder, pooling), declared.normalize
        model, tok_json = Embedder(encoder, pooling, normalize), tok.to_str()
        output, length = "embeddings", tok.truncation["max_length"]
        spec = {"use": "embed", "pooling": pooling, "normalize": normalize}
    spec |= {"output": output, "max_seq_length": length}
    spec |= {"quantized": quantize, "fp32_top": fp32_top, "source": str(path)}
    ids = torch.full((2, 8), 5, dtype=torch.long)  # any ids: shapes are what is traced
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        spec["width"] = model.eval()(ids, torch.zeros_like(ids), mask).shape[-1]
    axes = {k: {0: "batch", 1: "sequence"} for k in INPUTS} | {output: {0: "batch"}}
    with atomic_path(out_dir, folder=True) as tmp:
        onnx_path = tmp / "model.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            # The TorchScript exporter, deprecated but kept: ONNX Runtime runs its graph of our
            # encoder faster than the torch.export one's (docs/serving.md). Its tracer warns of
            # the length check and the q/k/v unpacking, which are constant for any input.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(
                model.eval(),
                (ids, torch.zeros_like(ids), mask),
                str(onnx_path),
                input_names=list(INPUTS),
                output_names=[output],
                dynamic_axes=axes,
                opset_version=OPSET,
                dynamo=False,
            )
        if quantize == "int8":  # the Linear layers' weights, a scale per output channel
            quantize_dynamic(
                onnx_path,
                tmp / "int8.onnx",
                weight_type=QuantType.QInt8,
                op_types_to_quantize=["MatMul", "Gemm"],  # not the embeddings' Gather
                per_channel=True,  # per tensor, a few large weights cost the rest their precision
                nodes_to_exclude=top_nodes(onnx.load(onnx_path).graph, L, fp32_top),
            )
            os.replace(tmp / "int8.onnx", onnx_path)
        (tmp / "tokenizer.json").write_text(tok_json)
        inputs = [i.name for i in onnx.load(onnx_path, load_external_data=False).graph.input]
        spec["inputs"] = inputs  # a bi-encoder's side reads no token types
        (tmp / SPEC).write_text(json.dumps(spec, indent=2) + "\n")
    return out_dir


def top_nodes(graph, layers: int, top: int) -> list[str]:
    """The MatMul and Gemm nodes of the top `top` of `layers` encoder layers and of all above
    them (the pooler, the head); none for 0."""
    out = []
    for node in graph.node:
        if top and node.op_type in ("MatMul", "Gemm"):
            layer = re.search(r"/encoder/layer\.(\d+)/", node.name)
            if layer is None or int(layer[1]) >= layers - top:
                out.append(node.name)
    return out
