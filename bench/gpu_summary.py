"""The one table of `bench/gpu_check.sh`: `python bench/gpu_summary.py OUT` reads the JSON each
check wrote in OUT (and the GPU run's metrics.csv) and prints markdown; a check that did not
finish shows as `-`."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path


def load(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def fit_rows(out: Path) -> list[str]:
    """The headline: train.py's fit, eager and compiled, each step against the bare step."""
    rows = []
    for mode in ("eager", "compiled"):
        f = load(out / f"fit_{mode}.json")
        if not f:
            rows.append(f"| train.py fit, {mode} | - | - |")
            continue
        mfu = f"MFU {f['fit_mfu']:.1%} (bare step {f['bare_mfu']:.1%}); " if f["fit_mfu"] else ""
        syncs = f["syncs_per_step"]
        sync = f"; {syncs:.2f} host syncs per non-logging step" if syncs is not None else ""
        rows.append(
            f"| train.py fit, {mode} ({' '.join(f['overrides'])}) | {mfu}"
            f"{f['fit_tok_s']:,.0f} tok/s{sync} | median fit step / bare step "
            f"{1 + f['median_overhead']:.3f} (mean {1 + f['mean_overhead']:.3f}) |"
        )
    return rows


def step_rows(out: Path) -> list[str]:
    rows = []
    for name, mode in (("eager", "eager"), ("compiled", "compiled"), ("large", "eager")):
        for r in load(out / f"step_{name}.json") or []:
            peak = r.get("table_peak_gflops")
            mfu = f"{r['gflops'] / peak:.1%}" if peak else "-"
            measured = f"{r['gflops'] / r['peak_gflops']:.0%}"
            rows.append(
                f"| {r['size']} bare step, {mode}, batch {r['batch']} x {r['seq']} | {mfu} "
                f"({measured} of a measured bf16 matmul) | {r['ours_tok_s']:,.0f} tok/s vs "
                f"transformers {r['theirs_tok_s']:,.0f} ({r['ratio']:.2f}x) |"
            )
    return rows or ["| step bench | - | - |"]


def padded_rows(out: Path) -> list[str]:
    rows = []
    for r in load(out / "padded_step.json") or []:
        vs = f"; {r['vs_transformers']:.2f}x transformers" if r["vs_transformers"] else ""
        rows.append(
            f"| padded step {r['workload']}, {r['dtype']} ({r['padding']:.0%} padding) | "
            f"unpadded {r['vs_padded']:.2f}x our padded path{vs} | "
            f"{r['ours_tok_s']:,.0f} real tok/s |"
        )
    return rows or ["| padded step bench | - | - |"]


def train_row(out: Path) -> str:
    metrics = sorted((out / "train_gpu").glob("**/metrics.csv"))
    if not metrics:
        return "| 2-minute train.py trainer=gpu model=bert_base | - | - |"
    with open(metrics[-1], newline="") as f:
        rows = list(csv.DictReader(f))
    last = lambda k: next((r[k] for r in reversed(rows) if r.get(k)), None)  # noqa: E731
    tok, mfu, val = last("train/tokens_per_s"), last("train/mfu"), last("val/loss")
    steps = max(int(r["step"]) for r in rows)
    figures = f"{steps} steps; tokens/s {float(tok):,.0f}" if tok else f"{steps} steps"
    if mfu:
        figures += f"; MFU {float(mfu):.1%}"
    return f"| 2-minute train.py trainer=gpu model=bert_base | {figures} | val/loss {val} |"


def main(out: Path) -> None:
    gpu = (out / "gpu.txt").read_text().strip() if (out / "gpu.txt").is_file() else "?"
    print(f"GPU: {gpu}\n")
    print("| check | figure | against |\n|---|---|---|")
    for row in [*fit_rows(out), *step_rows(out), *padded_rows(out), train_row(out)]:
        print(row)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
