"""Fine-tuning recipes side by side, in and out of their domain: each arm's fine-tuned checkpoint
(or `bert-lightning interpolate`'s) scores the Home Depot test split its first arm's run drew,
and, with `--other FILE`, a second query-product set it never trained on (CrowdFlower half A,
`--column`/`--grades` read as `bert-lightning evaluate` reads them); beside them the zero-shot
encoder and BM25. Per arm: per-query Spearman and NDCG@10 minus the zero-shot encoder's (paired
95% bootstrap intervals) and global Spearman minus its.

    python bench/recipe_arms.py --zero-shot FOLDER --other cf.csv --encoding utf-8 \\
        --column ad=product_title --column label=median_relevance --grades 1,4 --json s1234.json \\
        recipe=RUN/checkpoints/best.ckpt contrastive=... wise=wise.ckpt

Runs of several seeds (one JSON each) pool with `--combine A.json B.json ...`, the arms all ran:
per-query differences of every seed's test queries (Home Depot: each seed its own split) or
averaged over seeds per query (the other set: the same queries), one interval over them; global
Spearman differences as mean and standard deviation over seeds.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bert_lightning.commands.interpolate import run_config
from bert_lightning.commands.options import add_table_arguments, table_options, task_options
from bert_lightning.errors import UserError
from bert_lightning.inference import (
    load_finetuned,
    table_scores,
    zero_shot_cosines,
)
from bert_lightning.tasks.ad_relevance import score_metrics
from bert_lightning.tasks.base import load_splits
from bert_lightning.tasks.kinds import stored_task
from bert_lightning.tasks.ranking import interval, query_values

METRICS = ("query_spearman", "ndcg@10")


def compare(arms: dict, table: dict, zero_shot: str) -> dict:
    """Each scorer's per-query figures on one table, and each arm's per-query differences to
    the zero-shot encoder (kept, for `combine`) and its global Spearman difference."""
    first = next(iter(arms.values()))
    task = first.task
    baselines = task.baseline_scores(
        table, partial(zero_shot_cosines, zero_shot, max_seq_length=first.max_seq_length)
    )
    scores = {name: table_scores(ft.model, ft.task, ft.tokenizer(), table, ft.max_seq_length)
              for name, ft in arms.items()} | baselines  # fmt: skip
    values = {who: query_values(s, table["target"], table["group"]) for who, s in scores.items()}
    glob = {who: score_metrics(task, table, torch.as_tensor(s))["test/spearman"]
            for who, s in scores.items()}  # fmt: skip
    out = {"rows": len(table["target"]), "global_spearman": glob, "per_query": {}}
    for who in scores:
        out["per_query"][who] = {m: interval(values[who][m]) for m in METRICS}
    for name in arms:
        out[f"{name} - zero_shot"] = {
            "per_query": {m: (values[name][m] - values["zero_shot"][m]).tolist() for m in METRICS},
            "global_spearman": glob[name] - glob["zero_shot"],
        }
    return out


def measure(args) -> dict:
    arms = dict(a.split("=", 1) for a in args.arms)
    cfg = run_config(next(iter(arms.values())))
    if cfg is None:
        raise UserError(f"{args.arms[0]}: the first arm must be a checkpoint of a finetune.py run")
    run_task = stored_task(cfg["task"], args.arms[0])
    _, tables = load_splits(run_task, cfg["seed"])
    models = {name: load_finetuned(path) for name, path in arms.items()}
    out = {"seed": cfg["seed"], "arms": arms}
    out["home_depot"] = compare(models, tables["test"], args.zero_shot)
    if args.other:  # read as `bert-lightning evaluate` reads a file, with its options
        options = table_options(args) | task_options(args, next(iter(models.values())).task)
        other = {n: ft.with_table_options(options) for n, ft in models.items()}
        task = next(iter(other.values())).task
        table = task.with_labels(task.read(args.other))
        out["other"] = compare(other, table, args.zero_shot) | {"file": Path(args.other).name}
    return out


def combine(paths: list[str]) -> dict:
    """Seeds pooled (see the module's docstring)."""
    runs = [json.loads(Path(p).read_text()) for p in paths]
    out = {"seeds": [r["seed"] for r in runs]}
    for where in ("home_depot", "other"):
        if where not in runs[0]:
            continue
        out[where] = {}
        shared = set.intersection(*(set(r[where]) for r in runs))  # arms every seed ran
        for d in (k for k in runs[0][where] if k.endswith(" - zero_shot") and k in shared):
            row = {}
            for m in METRICS:
                seeds = [np.array(r[where][d]["per_query"][m], dtype=float) for r in runs]
                same_queries = where == "other"
                row[m] = interval(np.mean(seeds, 0) if same_queries else np.concatenate(seeds))
            g = np.array([r[where][d]["global_spearman"] for r in runs])
            std = float(g.std(ddof=1)) if len(g) > 1 else 0.0
            row["global_spearman"] = {"mean": float(g.mean()), "std": std}
            out[where][d.removesuffix(" - zero_shot")] = row
    return out


def table(report: dict) -> str:
    lines = []
    for where, rows in report.items():
        if where == "seeds":
            continue
        lines.append(f"{where} (seeds {report['seeds']}): minus the zero-shot encoder")
        lines.append(f"{'arm':<16}" + "".join(f"{m:>26}" for m in (*METRICS, "global spearman")))
        for arm, row in rows.items():
            cells = [f"{c['mean']:+.3f} [{c['low']:+.3f}, {c['high']:+.3f}]"
                     for c in (row[m] for m in METRICS)]  # fmt: skip
            g = row["global_spearman"]
            cells.append(f"{g['mean']:+.3f} ± {g['std']:.3f}")
            lines.append(f"{arm:<16}" + "".join(f"{c:>26}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("arms", nargs="*", help="NAME=CKPT, the first one a checkpoint of a run")
    p.add_argument("--zero-shot", help="the encoder fine-tuning started from")
    p.add_argument("--other", help="a second set, scored as `evaluate` scores a file")
    p.add_argument("--column", action="append", default=[], help="KEY=NAME of --other")
    p.add_argument("--grades", help="MIN,MAX of --other's labels")
    add_table_arguments(p)  # --format, --encoding, --header, --names of --other
    p.add_argument("--json", help="write the measurement here")
    p.add_argument("--combine", nargs="+", help="pool these measurements (one per seed)")
    args = p.parse_args()
    if args.combine:
        print(table(combine(args.combine)))
        return
    out = measure(args)
    if args.json:
        Path(args.json).write_text(json.dumps(out) + "\n")
    print(table(combine([args.json])) if args.json else json.dumps(out)[:2000])


if __name__ == "__main__":
    main()
