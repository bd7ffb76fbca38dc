"""Where int8's error comes from: variants of one fine-tuned model's ONNX export, each scored on
the same test rows against PyTorch (the 0-1 score's difference: p50, p99, max, and the rows a
0.5 threshold puts on the other side). The variants quantize as `export-onnx --quantize int8`
does (dynamic, per-channel QInt8 weights of every weight MatMul) all or some of the Linear
layers: one kind in every layer (`q/k/v`, attention output, FFN in, FFN out), one layer, all
with 7-bit (`reduce_range`) or unsigned weights, and the weights alone rounded to int8 with
the arithmetic in fp32 (the weights' share of the error). `--speed` also times each variant
in batches of 32 against the fp32 export, in the same rounds (each round starting at another).

    python bench/int8_variants.py --model <run>/checkpoints/best-step<N>.ckpt --test test.csv \
        [--rows 2000] [--speed 3] [--out variants.json]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

KINDS = {  # the kind of a weight MatMul, by its node name in the export (one fused q/k/v)
    "q/k/v": r"/self/qkv/",
    "attention output": r"/layer\.\d+/dense/",
    "FFN in": r"/intermediate/dense/",
    "FFN out": r"/dense_1/",
}


def layer_of(name: str) -> int | None:
    m = re.search(r"/encoder/layer\.(\d+)/", name)
    return int(m[1]) if m else None


def kind_of(name: str) -> str | None:
    if layer_of(name) is None:
        return None
    return next((k for k, pattern in KINDS.items() if re.search(pattern, name)), None)


def weight_matmuls(graph) -> list[str]:
    weights = {i.name for i in graph.initializer}
    return [
        n.name for n in graph.node if n.op_type == "MatMul" and any(x in weights for x in n.input)
    ]


def quantized(fp32: Path, out: Path, nodes: list[str] | None = None, **options) -> Path:
    """`fp32`'s export with `nodes` (None: every weight MatMul) dynamically quantized."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    if nodes == []:  # quantize_dynamic would take it as every node
        raise ValueError(f"{out.name}: no node of the export to quantize")

    shutil.copytree(fp32, out)
    options = {"weight_type": QuantType.QInt8, "per_channel": True} | options
    options["op_types_to_quantize"] = ["MatMul", "Gemm"]  # as export-onnx: not the embeddings
    quantize_dynamic(fp32 / "model.onnx", out / "model.onnx", nodes_to_quantize=nodes, **options)
    return out


def weights_rounded(fp32: Path, out: Path) -> Path:
    """`fp32`'s export with each weight MatMul's weights rounded to per-channel int8 and kept in
    fp32: the weights' rounding without the activations'."""
    import onnx
    from onnx import numpy_helper

    shutil.copytree(fp32, out)
    model = onnx.load(fp32 / "model.onnx")
    used = {n.input[1] for n in model.graph.node if n.op_type == "MatMul"}
    for init in model.graph.initializer:
        if init.name in used:
            w = numpy_helper.to_array(init)  # (in, out)
            scale = np.abs(w).max(0, keepdims=True) / 127  # (1, out): per output channel
            rounded = (np.round(w / np.where(scale == 0, 1, scale)) * scale).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(rounded, init.name))
    onnx.save(model, out / "model.onnx")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="a fine-tuned .ckpt")
    p.add_argument("--test", required=True, help="its task's test file")
    p.add_argument("--rows", type=int, default=0, help="the first N rows (0: all)")
    p.add_argument("--speed", type=int, default=0, help="rounds of timing (0: none)")
    p.add_argument("--out", type=Path, help="where to write the results (JSON)")
    a = p.parse_args()
    import onnx
    from onnxruntime.quantization import QuantType

    from bert_lightning.inference import load_finetuned, score_rows, table_scores
    from bert_lightning.onnx_export import export_onnx
    from bert_lightning.tasks.base import subset

    torch_ft = load_finetuned(a.model)
    task = torch_ft.task
    table = task.with_labels(task.read(a.test))
    table = subset(table, list(range(a.rows))) if a.rows else table
    score = lambda ft: table_scores(ft.model, task, ft.tokenizer(), table, ft.max_seq_length)
    reference = score(torch_ft).numpy()  # (rows,)
    results = {}
    print("| variant | p50 | p99 | max | across 0.5 |\n|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        fp32 = Path(tmp) / "fp32"
        export_onnx(
            a.model, fp32, quantize=None, pooling=None, max_seq_length=None, overwrite=False
        )
        nodes = weight_matmuls(onnx.load(fp32 / "model.onnx").graph)
        variants = {"every Linear int8 (--quantize int8)": lambda d: quantized(fp32, d)}
        for kind in KINDS:
            chosen = [n for n in nodes if kind_of(n) == kind]
            variants[f"only {kind} int8"] = lambda d, c=chosen: quantized(fp32, d, c)
        for layer in sorted({layer_of(n) for n in nodes} - {None}):
            chosen = [n for n in nodes if layer_of(n) == layer]
            variants[f"only layer {layer} int8"] = lambda d, c=chosen: quantized(fp32, d, c)
        variants["reduce_range (7-bit weights)"] = lambda d: quantized(fp32, d, reduce_range=True)
        variants["QUInt8 weights"] = lambda d: quantized(fp32, d, weight_type=QuantType.QUInt8)
        variants["weights rounded to int8, fp32 arithmetic"] = lambda d: weights_rounded(fp32, d)
        built = {}
        for i, (name, build) in enumerate(variants.items()):
            built[name] = build(Path(tmp) / f"v{i}")
            scores = score(load_finetuned(built[name])).numpy()  # (rows,)
            diff = np.abs(scores - reference)  # (rows,)
            r = results[name] = {
                "p50": float(np.quantile(diff, 0.5)),
                "p99": float(np.quantile(diff, 0.99)),
                "max": float(diff.max()),
                "across_0.5": float(np.mean((scores >= 0.5) != (reference >= 0.5))),
            }
            print(f"| {name} | {r['p50']:.4f} | {r['p99']:.4f} | {r['max']:.4f} | "
                  f"{r['across_0.5']:.2%} |", flush=True)  # fmt: skip
        if a.speed:
            from loadtest import home_depot_pairs

            folders = {"fp32": fp32} | built
            fts = {n: load_finetuned(f) for n, f in folders.items()}
            pairs = home_depot_pairs(fts["fp32"].tokenizer(), 512)
            runs = {n: [] for n in fts}
            names = list(fts)
            for r in range(a.speed):
                for n in names[r % len(names) :] + names[: r % len(names)]:
                    start = time.perf_counter()
                    score_rows(fts[n].model, task, fts[n].tokenizer(), pairs, 32)
                    runs[n].append(len(pairs) / (time.perf_counter() - start))
            for n in built:
                ratios = [x / b for x, b in zip(runs[n], runs["fp32"], strict=True)]
                results[n]["over_fp32"] = statistics.median(ratios)
                print(f"{n}: {statistics.median(ratios):.2f}x fp32's pairs/s")
    if a.out:
        a.out.write_text(json.dumps({"rows": len(reference), "variants": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
