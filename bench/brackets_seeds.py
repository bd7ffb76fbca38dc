"""Claim 5 of the brackets suite over pretraining seeds: max-pooled vs `[CLS]` classifier.

    python bench/brackets_seeds.py outputs/brackets_seeds 1234 1 2 3 4 5 6 7

For each seed: `train.py experiment=brackets seed=N`, then the report's four fine-tuning runs
(`finetune.py experiment=brackets_grammar`: head only, all weights, random encoder, all weights
from `[CLS]`), all through `run_all`; prints one markdown row per seed (test accuracy, percent).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bert_lightning.experiments.brackets.report import run_all

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("seeds", nargs="+", type=int)
    args = p.parse_args()
    rows = []
    for seed in args.seeds:
        r = run_all(args.out_dir / f"seed{seed}", [f"seed={seed}", *QUIET], ["bidirectional"])
        cells = [r["bidirectional"]["overall"], *r["finetune"].values()]
        rows.append(f"| {seed} | " + " | ".join(f"{v:5.1f}" for v in cells) + " |")
    print("\n| seed | MLM accuracy | " + " | ".join(r["finetune"]) + " |")
    print("|---" * (2 + len(r["finetune"])) + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
