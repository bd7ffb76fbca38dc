"""`bert-lightning downstream MODEL... --data-dir DIR [--tasks sst2,cola]`:
every model fine-tuned on every task over `--seeds` seeds on one fixed budget per task, beside
the same shapes from random weights; writes downstream.md, downstream.json, downstream.png.
`--ranking zero_shot|bm25` tables the ranking cells' paired per-query gains too; without
MODEL it tables the finished cells of `--out` alone."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "downstream",
        help="fine-tune models on a fixed suite of tasks and seeds; a table of what each bought",
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="a .ckpt of ours or a Hugging Face BERT folder, as PATH or NAME=PATH",
    )
    p.add_argument("--tasks", help="comma-separated (default: every task of the budget)")
    p.add_argument(
        "--data-dir",
        help="the folder holding glue_sst2/, glue_cola/, wnut17/, home_depot/ as published",
    )
    p.add_argument(
        "--seeds", default="3", help="N: seeds 1..N per cell; or a list such as 2,3 (those seeds)"
    )
    p.add_argument(
        "--budget",
        default="cpu",
        help="cpu, gpu, home_depot_ranking (experiments/budgets/) or a YAML file",
    )
    p.add_argument(
        "--out", default="outputs/downstream", help="the suite's folder (rerun: continues)"
    )
    p.add_argument("--no-random", action="store_true", help="no random-weights row")
    p.add_argument(
        "--ranking",
        choices=("zero_shot", "bm25"),
        help="also table each ranking cell's per-query gain over this baseline",
    )
    p.set_defaults(func=_run, parser=p)


def _run(a) -> None:
    from bert_lightning.experiments.downstream import downstream, ranking_table

    if not a.models:
        if not a.ranking:
            a.parser.error("give MODEL... (or --ranking alone: the table of --out's cells)")
        print(ranking_table(Path(a.out), a.ranking))
        return
    if not a.data_dir:
        a.parser.error("the following arguments are required: --data-dir")
    downstream(
        a.models,
        [t for t in a.tasks.split(",") if t] if a.tasks else None,
        a.data_dir,
        seeds=a.seeds,
        budget=a.budget,
        out=a.out,
        random=not a.no_random,
        ranking=a.ranking,
    )
