"""A recipe's ablation: each arm changes one thing from a base, every arm gets the same
wall-clock budget, and each is scored by its held-out figures at the budget's end.

    python bench/ablate.py OUT --minutes 5 \
        --arm base= --arm lr5e-4=optim.lr=5e-4 \
        --arm preln='model.pre_layer_norm=true optim.lr=2e-3' \
        experiment=cpu_30min data=corpus ...

`--arm NAME=OVERRIDES` (space-separated overrides; empty for the base) runs
`train.py <overrides...> <arm's overrides>` into `OUT/NAME/` with `trainer.max_time` set to the
budget (bench/budget_runs.py's `pretrain`: a finished arm is not redone unless its overrides
or budget changed, a stopped one continues). Writes `OUT/ablation.md` and `OUT/ablation.json`:
steps, median tokens/s and the last validation's figures of each arm. Run nothing else
meanwhile: the budget is wall time.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from budget_runs import pretrain, steps_taken

from bert_lightning.atomic import write_json, write_text


def figures(folder: Path) -> dict:
    """Steps, median training tokens/s and the last validation's `val/*` values of one run."""
    with open(folder / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    speeds = [float(r["train/tokens_per_s"]) for r in rows if r.get("train/tokens_per_s")]
    val = [r for r in rows if r.get("val/loss")][-1]
    return {
        "steps": steps_taken("ours", folder),
        "tokens_per_s": statistics.median(speeds) if speeds else float("nan"),
        **{k: float(v) for k, v in val.items() if k.startswith("val/") and v},
    }


def table(results: dict) -> str:
    keys = sorted({k for r in results.values() for k in r if k.startswith("val/")})
    head = ["arm", "overrides", "steps", "tokens/s (median)", *keys]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, r in results.items():
        cells = [name, f"`{r['overrides']}`" if r["overrides"] else "-", f"{r['steps']:,}"]
        cells.append(f"{r['tokens_per_s']:,.0f}")
        cells += [f"{r[k]:.3f}" if k in r else "-" for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--arm", action="append", required=True, help="NAME=OVERRIDES (repeatable)")
    a, overrides = p.parse_known_args()
    arms = dict(arm.partition("=")[::2] for arm in a.arm)
    a.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, extra in arms.items():
        folder = a.out / name
        pretrain("ours", folder, a.minutes, [*overrides, *extra.split()])
        results[name] = {"overrides": extra, **figures(folder)}
        write_json(
            {"minutes": a.minutes, "overrides": overrides, "arms": results}, a.out / "ablation.json"
        )
    text = table(results)
    write_text(a.out / "ablation.md", text + "\n")
    print(text)


if __name__ == "__main__":
    main()
