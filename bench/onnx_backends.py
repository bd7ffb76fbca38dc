"""PyTorch eager, ONNX Runtime fp32 and ONNX Runtime int8 side by side (issue #31): `score`'s
pairs/s one pair at a time and in batches of 32, on pairs of Home Depot's word-piece lengths
(serve.py's), each backend first in turn over `--rounds` rounds: medians, and the median of
each round's ratio to PyTorch; then what int8 costs: the scores' largest difference to
PyTorch's, for an embedding model (all-MiniLM-L6-v2, mean pooling) the cosine of each int8
and fp32 embedding to PyTorch's, and with `--test FILE` the fine-tuned model's test metrics
per backend (`evaluate`'s: AUROC, Spearman, NDCG@10, the per-query ones). The scores'
difference to PyTorch's (on the test file's rows, else on the timed pairs): median, 99th
percentile, max and mean, and the share of rows a 0.5 threshold puts on the other side;
`--fp32-top N` adds the int8 export with the top N layers and the head left in fp32.

    python bench/onnx_backends.py                     # all-MiniLM-L6-v2 cross-encoder, 3 rounds
    python bench/onnx_backends.py --model <run>/checkpoints/best-step<N>.ckpt --test test.csv
    python bench/onnx_backends.py --vs student=<HF folder or .ckpt> --rounds 7

The default model is loadtest.py's: all-MiniLM-L6-v2's encoder under an untrained ad_relevance
head (its scores mean nothing; its forward pass is a fine-tuned one's). Each backend scores
the same pairs through `inference.score_rows`, as `bert-lightning score` does; torch and ONNX
Runtime get the same threads (`--threads`, default torch's). `--vs NAME=PATH` puts another
encoder under the same untrained head and times its int8 export in the same rounds: its pairs/s
over the model's int8, round by round (a distilled student against its teacher)."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from loadtest import home_depot_pairs, minilm_folder, paired_median, relevance_ckpt

from bert_lightning.inference import (
    embed_texts,
    load_embedder,
    load_finetuned,
    score_rows,
    table_scores,
    task_metrics,
)
from bert_lightning.onnx_export import export_onnx

BACKENDS = ("torch", "onnx", "int8")


def exported(model, out: Path, quantize, pooling=None, fp32_top=0) -> Path:
    return export_onnx(
        model,
        out,
        quantize=quantize,
        pooling=pooling,
        max_seq_length=None,
        overwrite=False,
        fp32_top=fp32_top,
    )


def score_diffs(scores: dict) -> dict:
    """Each backend's scores against PyTorch's on the same rows: |difference| max, mean, median
    and 99th percentile, and the share of rows a 0.5 threshold puts on the other side."""
    ref = scores["torch"]
    return {
        k: {
            "max": float(np.abs(s - ref).max()),
            "mean": float(np.abs(s - ref).mean()),
            "p50": float(np.quantile(np.abs(s - ref), 0.5)),
            "p99": float(np.quantile(np.abs(s - ref), 0.99)),
            "crosses_0.5": float(np.mean((s >= 0.5) != (ref >= 0.5))),
        }
        for k, s in scores.items()
        if k != "torch"
    }


def pairs_per_s(ft, tok, pairs, batch_size: int) -> float:
    start = time.perf_counter()
    score_rows(ft.model, ft.task, tok, pairs, batch_size)
    return len(pairs) / (time.perf_counter() - start)


def speed(models: dict, pairs: list, rounds: int, one_at_a_time: int) -> dict:
    """{backend: {"batch 1": [pairs/s of each round], "batch 32": [...]}}; round r starts with
    backend r."""
    toks = {k: ft.tokenizer() for k, ft in models.items()}
    for k, ft in models.items():  # first calls: allocator, ORT's arenas
        score_rows(ft.model, ft.task, toks[k], pairs[:64], 32)
    runs: dict = {k: {"batch 1": [], "batch 32": []} for k in models}
    names = list(models)
    for r in range(rounds):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            runs[k]["batch 1"].append(pairs_per_s(models[k], toks[k], pairs[:one_at_a_time], 1))
            runs[k]["batch 32"].append(pairs_per_s(models[k], toks[k], pairs, 32))
    return runs


def medians(runs: dict) -> tuple[dict, dict]:
    """Each backend's median pairs/s, and its `paired_median` ratio to torch's."""
    rates = {k: {b: round(statistics.median(v), 1) for b, v in d.items()} for k, d in runs.items()}
    paired = {
        k: {b: paired_median(v, runs["torch"][b]) for b, v in d.items()} for k, d in runs.items()
    }
    return rates, paired


def embedding_cosines(folder: Path, texts: list[str], tmp: Path) -> dict:
    """The cosine of each ONNX Runtime embedding (fp32, int8) to PyTorch's: min and mean."""
    model, tok = load_embedder(folder)
    want = embed_texts(model, tok, texts, "mean")
    out = {}
    for name, quantize in (("onnx", None), ("int8", "int8")):
        m, t = load_embedder(exported(folder, tmp / f"embed_{name}", quantize))
        cos = torch.nn.functional.cosine_similarity(embed_texts(m, t, texts, "mean"), want)
        out[name] = {"min": round(float(cos.min()), 5), "mean": round(float(cos.mean()), 5)}
    return out


def test_metrics(ft, path) -> dict:
    """`evaluate`'s numbers for one backend: the task's metrics and the per-query means."""
    got = task_metrics(ft, path)
    ranked = got.get("ranking", {}).get("fine-tuned", {})
    per_query = {f"{m.removeprefix('query_')} (per query)": c["mean"] for m, c in ranked.items()}
    return {k: v for k, v in got.items() if isinstance(v, float)} | per_query


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="a fine-tuned .ckpt (default: loadtest.py's MiniLM)")
    p.add_argument("--embedder", help="an embedding model (default: all-MiniLM-L6-v2)")
    p.add_argument("--pairs", type=int, default=512)
    p.add_argument("--one-at-a-time", type=int, default=128, help="pairs scored one by one")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, help="torch's and ONNX Runtime's (default: torch's)")
    p.add_argument("--test", help="a file in the model's task format: its metrics per backend")
    p.add_argument("--json", default="onnx_backends.json")
    p.add_argument("--vs", help="NAME=PATH: another encoder's int8, in the same rounds")
    p.add_argument("--fp32-top", type=int, default=0, help="also int8 with the top N layers fp32")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        ckpt = args.model or str(relevance_ckpt(minilm_folder(), tmp / "minilm.ckpt"))
        models = {"torch": load_finetuned(ckpt)}
        models["onnx"] = load_finetuned(exported(ckpt, tmp / "onnx", None))
        models["int8"] = load_finetuned(exported(ckpt, tmp / "int8", "int8"))
        if args.fp32_top:
            top = exported(ckpt, tmp / "top", "int8", fp32_top=args.fp32_top)
            models[f"int8, top {args.fp32_top} fp32"] = load_finetuned(top)
        same = list(models)  # the model's backends; then another encoder's
        if args.vs:
            name, _, path = args.vs.partition("=")
            other = relevance_ckpt(Path(path), tmp / f"{name}.ckpt")
            models[f"int8, {name}"] = load_finetuned(exported(other, tmp / name, "int8"))
        pairs = home_depot_pairs(models["torch"].tokenizer(), args.pairs)
        runs = speed(models, pairs, args.rounds, args.one_at_a_time)
        rates, speedup = medians(runs)
        vs_int8 = {
            k: {b: paired_median(v, runs["int8"][b]) for b, v in runs[k].items()}
            for k in list(models)[len(same) :]
        }
        if args.test:  # the test file's rows, else the timed pairs
            task = models["torch"].task
            table = task.with_labels(task.read(args.test))
            scores = {
                k: table_scores(
                    models[k].model, task, models[k].tokenizer(), table, models[k].max_seq_length
                ).numpy()
                for k in same
            }
        else:
            scores = {
                k: np.array(
                    score_rows(models[k].model, models[k].task, models[k].tokenizer(), pairs)
                )
                for k in same
            }
        metrics = {k: test_metrics(models[k], args.test) for k in same} if args.test else None
        texts = [f"{q} {a}" for q, a in pairs[:256]]
        cosines = embedding_cosines(Path(args.embedder or minilm_folder()), texts, tmp)
    summary = {
        "model": args.model or "all-MiniLM-L6-v2 + untrained ad_relevance head",
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "pairs_per_s": rates,
        "speedup_vs_torch": speedup,
        "speedup_vs_int8": vs_int8,
        "rounds_pairs_per_s": runs,
        "score_diff_vs_torch": score_diffs(scores),
        "score_diff_rows": len(scores["torch"]),
        "embedding_cosine_to_torch": cosines,
        "test_metrics": metrics,
    }
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(
        "| backend | pairs/s, one at a time | pairs/s, batches of 32 | score diff to PyTorch: "
        "p50 / p99 / max | mean | rows across 0.5 |"
    )
    print("|---|---|---|---|---|---|")
    for k in models:
        cells = [f"{rates[k][b]} ({speedup[k][b]:.2f}x)" for b in ("batch 1", "batch 32")]
        d = summary["score_diff_vs_torch"].get(k)
        cells += (
            [
                f"{d['p50']:.2e} / {d['p99']:.2e} / {d['max']:.2e}",
                f"{d['mean']:.2e}",
                f"{d['crosses_0.5']:.2%}",
            ]
            if d
            else ["-", "-", "-"]
        )
        print(f"| {k} | {' | '.join(cells)} |")
    if vs_int8:
        print(f"\nover the model's int8, round by round: {vs_int8}")
    if metrics:
        names = [k for k, v in metrics["torch"].items() if isinstance(v, float)]
        print(f"\n| backend | {' | '.join(names)} |\n|---|{'---|' * len(names)}")
        for k, m in metrics.items():
            print(f"| {k} | " + " | ".join(f"{m[n]:.4f}" for n in names) + " |")
    print(f"\nembedding cosine to torch (min / mean): {cosines}; wrote {args.json}")


if __name__ == "__main__":
    main()
