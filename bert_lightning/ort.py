"""A model as it is used, exported to ONNX (optionally int8; `onnx_export.py`), and run
with ONNX Runtime: what CPU fleets serving ads run. An exported folder holds `model.onnx`,
`tokenizer.json` and `onnx.json` (what the graph computes: inputs, output, the task or the
pooling, the length it truncates to); `score`, `embed`, `evaluate` and `serve` take it where
they take a checkpoint, through `inference`'s loaders, so the same loops compute the same
outputs from either.

What is exported: a fine-tuned sequence or token head, its logits (the task turns them into
scores, as from PyTorch); a bi-encoder, its encoder and pooling (the pair's cosine and the
1 -> 1 head run around the graph, as `BertBiEncoder.cosine` runs them); any other checkpoint or
Hugging Face folder, the embedding of `--pooling` (a sentence-transformers folder's: the one it
declares, of unit length where it has a Normalize module, as `embed` makes it from the folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from torch import nn

from bert_lightning.data.tokenizer import load_tokenizer
from bert_lightning.errors import UserError
from bert_lightning.fields import check_choices, check_keys, json_file
from bert_lightning.model import BertModel
from bert_lightning.model.heads import BertBiEncoder, pair_cosine, pool

SPEC = "onnx.json"
INPUTS = ("input_ids", "token_type_ids", "attention_mask")


def onnx_runtime():
    """onnxruntime, or one line saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise UserError(
            "ONNX needs the [onnx] extra: pip install 'bert-lightning[onnx]' (onnx, onnxruntime)"
        ) from None
    return onnxruntime


def is_exported(path) -> bool:
    return (Path(path) / SPEC).is_file()


# what `onnx.json` says (onnx_export.py writes it), with the types of its values
SPEC_TYPES = {
    "use": Literal["finetuned", "embed"],
    "head": Literal["bi_encoder", "logits"] | None,
    "task": dict,
    "pooling": str,
    "normalize": bool,
    "output": str,
    "max_seq_length": int,
    "quantized": str | None,
    "fp32_top": int | None,
    "source": str,
    "width": int,
    "classifier": list,
    "encoder": str,  # a bi-encoder's fingerprint (`catalogue.encoder_fingerprint`)
    "inputs": list,
}


# the operators `export-onnx` writes (every head, pooling, fp32 and int8): a graph is a program,
# and one of other operators (a `Loop` of 10^12 turns, which no signal stops) is refused
ONNX_OPS = set(
    [
        "Add",
        "Cast",
        "Clip",
        "Concat",
        "Constant",
        "ConstantOfShape",
        "Div",
        "DynamicQuantizeLinear",
        "Erf",
        "Expand",
        "Gather",
        "Gemm",
        "Identity",
        "IsNaN",
        "LayerNormalization",
        "MatMul",
        "MatMulInteger",
        "Max",
        "Mod",
        "Mul",
        "Neg",
        "Not",
        "Pow",
        "ReduceL2",
        "ReduceMax",
        "ReduceSum",
        "Reshape",
        "Shape",
        "Slice",
        "Softmax",
        "Split",
        "Sqrt",
        "Squeeze",
        "Sub",
        "Tanh",
        "Transpose",
        "Unsqueeze",
        "Where",
    ]
)


def check_graph(path: Path) -> None:
    """An exported folder's `model.onnx` holds only the operators `export-onnx` writes, in
    ONNX's own domain: no control flow (`Loop`, `If`, `Scan`) or custom operator."""
    import onnx

    try:
        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception as e:  # protobuf's own error: not an ONNX file
        raise UserError(f"{path}: not an ONNX model ({' '.join(str(e).split())[:200]})") from None
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in ONNX_OPS:
            raise UserError(
                f"{path}: operator {node.domain or 'ai.onnx'}.{node.op_type}: not one that "
                "export-onnx writes (an exported folder is data: its graph runs as it is)"
            )


def spec_of(folder) -> dict:
    """What an exported folder's graph computes (`onnx.json`), its values typed."""
    path = Path(folder) / SPEC
    spec = json_file(path, SPEC_TYPES)
    check_keys(spec, SPEC_TYPES, str(path))
    check_choices(spec, SPEC_TYPES, str(path))
    if "use" not in spec:
        raise UserError(f"{path}: no 'use' (finetuned or embed)")
    head = spec.get("classifier", [0.0, 0.0])
    if len(head) != 2 or not all(isinstance(v, int | float) for v in head):
        raise UserError(f"{path}.classifier: expected [weight, bias], got {head!r}")
    return spec


class Embedder(nn.Module):
    """input ids, token types, mask -> (B, H) one vector per text, pooled by `pooling` and of
    unit length if `normalize`, as `inference.embed_texts` makes it: in the graph, so that any
    runner of the export gets the model's own vectors."""

    def __init__(self, bert: BertModel, pooling: str, normalize: bool):
        super().__init__()
        self.bert, self.pooling, self.normalize = bert, pooling, normalize

    def forward(self, input_ids, token_type_ids, attention_mask):
        out = self.bert(input_ids, token_type_ids, attention_mask, output_hidden_states=True)
        v = pool(out.hidden_states, attention_mask, self.pooling)  # (B, H)
        return nn.functional.normalize(v, dim=-1) if self.normalize else v  # (B, H)


class BiEncoderSide(nn.Module):
    """One text of a bi-encoder's pair -> (B, H), as `BertBiEncoder.embed` reads it."""

    def __init__(self, model: BertBiEncoder):
        super().__init__()
        self.model = model

    def forward(self, input_ids, token_type_ids, attention_mask):
        return self.model.embed(input_ids, attention_mask)  # (B, H)


class OrtModel(nn.Module):
    """An exported graph called as our models are: (input_ids, token_type_ids, attention_mask)
    -> its output as a torch tensor, on the CPU, with as many intra-op threads as torch has
    (`serve --threads`, OMP_NUM_THREADS)."""

    def __init__(self, folder):
        super().__init__()
        ort = onnx_runtime()
        self.folder = Path(folder)
        self.spec = spec_of(folder)
        check_graph(self.folder / "model.onnx")
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.intra_op_num_threads = torch.get_num_threads()
        self.session = ort.InferenceSession(
            str(self.folder / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.inputs = {i.name for i in self.session.get_inputs()}  # a bi-encoder's lacks types

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        ids = input_ids.cpu()
        token_types = torch.zeros_like(ids) if token_type_ids is None else token_type_ids.cpu()
        mask = torch.ones_like(ids) if attention_mask is None else attention_mask.cpu()
        given = zip(INPUTS, (ids, token_types, mask), strict=True)
        feeds = {k: v.long().numpy() for k, v in given if k in self.inputs}
        return torch.from_numpy(self.session.run(None, feeds)[0])


class OrtBiEncoder(nn.Module):
    """A bi-encoder whose two texts are embedded by the exported encoder: the logit is
    `classifier(cos(u, v))`, as `BertBiEncoder` computes it; `embed` and `classifier` are
    `BertBiEncoder`'s, for a catalogue's queries (`catalogue.text_vectors`)."""

    def __init__(self, encoder: OrtModel):
        super().__init__()
        self.encoder, self.pooling = encoder, encoder.spec["pooling"]
        self.classifier = nn.Linear(1, 1)
        with torch.no_grad():
            self.classifier.weight.fill_(encoder.spec["classifier"][0])
            self.classifier.bias.fill_(encoder.spec["classifier"][1])

    def embed(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(ids, torch.zeros_like(ids), mask)  # (B, H)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None):
        cos = pair_cosine(self.embed, input_ids, token_type_ids, attention_mask)  # (B,)
        return self.classifier(cos[:, None])  # (B, 1)


def load_exported(folder) -> tuple[nn.Module, dict, str]:
    """(the model, its spec, its tokenizer's JSON) of an exported folder."""
    model = OrtModel(folder)
    tokenizer_json = load_tokenizer(Path(folder) / "tokenizer.json").to_str()  # checked
    if model.spec.get("head") == "bi_encoder":
        return OrtBiEncoder(model), model.spec, tokenizer_json
    return model, model.spec, tokenizer_json
