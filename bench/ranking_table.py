"""The Home Depot ranking ablation's table (bench/budgets/home_depot_ranking.yaml, run by
`bert-lightning downstream`): for each start and arm, the per-query Spearman and NDCG@10 minus
the start's zero-shot cosine on the same test queries (over seeds: mean ± std and in how many
seeds the paired 95% bootstrap interval lies above 0; of one seed: the interval), beside the
global Spearman and AUROC.

    python bench/ranking_table.py outputs/ranking_ablation [--against zero_shot]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

PER_QUERY = ("spearman", "ndcg@10")
GLOBAL = ("spearman", "auroc")


def cells(out: Path) -> dict:
    """{(start, arm): [results.json of each finished seed]}."""
    found: dict = {}
    for path in sorted(out.glob("cells/*/*/seed*/results.json")):
        start, arm = path.parts[-4], path.parts[-3]
        found.setdefault((start, arm), []).append(json.loads(path.read_text()))
    return found


def mean_std(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):+.4f} ± {sd:.4f}"


def row(start: str, arm: str, runs: list[dict], against: str) -> str:
    cells = [start, arm, str(len(runs))]
    for m in PER_QUERY:
        diffs = [r["ranking"][f"fine-tuned - {against}"][m] for r in runs]
        above = sum(d["low"] > 0 for d in diffs)
        if len(diffs) == 1:  # one seed: its interval
            cells.append(
                f"{diffs[0]['mean']:+.4f} [{diffs[0]['low']:+.4f}, {diffs[0]['high']:+.4f}]"
            )
        else:
            cells.append(f"{mean_std([d['mean'] for d in diffs])} ({above}/{len(diffs)} above 0)")
    for m in GLOBAL:
        cells.append(f"{statistics.mean(r['test'][f'test/{m}'] for r in runs):.4f}")
    return "| " + " | ".join(cells) + " |"


def table(out: Path, against: str) -> str:
    head = ["start", "arm", "seeds"]
    head += [f"per-query {m} minus {against}" for m in PER_QUERY]
    head += [f"global {m}" for m in GLOBAL]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [row(s, a, runs, against) for (s, a), runs in cells(out).items()]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("out", help="the suite's --out")
    p.add_argument("--against", default="zero_shot", help="the baseline: zero_shot or bm25")
    args = p.parse_args()
    print(table(Path(args.out), args.against))


if __name__ == "__main__":
    main()
