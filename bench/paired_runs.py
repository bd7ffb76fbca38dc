"""Two fine-tuning runs of one ranking task on the same test rows (the same data and `seed`, so
the same query-grouped split), query by query: each run's best checkpoint scores the test
split its config draws, and `ranking_report` gives each run's per-query metrics and the paired
difference, first minus second, with its 95% bootstrap interval (a distilled student's recipe
against its teacher's).

    python bench/paired_runs.py outputs/hd_student outputs/hd_teacher [--json paired.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bert_lightning.errors import UserError
from bert_lightning.inference import load_finetuned, table_scores
from bert_lightning.tasks.base import load_splits
from bert_lightning.tasks.kinds import make_task
from bert_lightning.tasks.ranking import ranking_report, ranking_table


def test_scores(run: Path) -> tuple[dict, torch.Tensor]:
    """(the run's test table, its best checkpoint's (N,) scores of the table's rows)."""
    cfg = OmegaConf.load(run / "config_resolved.yaml")
    best = json.loads((run / "results.json").read_text())["best_checkpoint"]
    _, tables = load_splits(make_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.seed)
    ft = load_finetuned(run / best)
    table = tables["test"]
    return table, table_scores(ft.model, ft.task, ft.tokenizer(), table, ft.max_seq_length)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("first", type=Path, help="a finetune.py run folder")
    p.add_argument("second", type=Path, help="another, on the same task, data and seed")
    p.add_argument("--json", help="also write the report here")
    args = p.parse_args()
    (a, sa), (b, sb) = test_scores(args.first), test_scores(args.second)
    same = ("text", "pair", "target", "group")
    if any(list(a[k]) != list(b[k]) for k in same):
        raise UserError(f"{args.first} and {args.second} tested different rows (data or seed)")
    names = (args.first.name, args.second.name)
    report = ranking_report(dict(zip(names, (sa, sb), strict=True)), a["target"], a["group"])
    print(f"{len(sa)} test rows\n{ranking_table(report)}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
