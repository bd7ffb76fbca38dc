"""`bert-lightning downstream MODEL... --data-dir DIR [--tasks sst2,cola]`:
every model fine-tuned on every task over `--seeds` seeds on one fixed budget per task, beside
the same shapes from random weights; writes downstream.md, downstream.json, downstream.png."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "downstream",
        help="fine-tune models on a fixed suite of tasks and seeds; a table of what each bought",
    )
    p.add_argument(
        "models",
        nargs="+",
        metavar="MODEL",
        help="a .ckpt of ours or a Hugging Face BERT folder, as PATH or NAME=PATH",
    )
    p.add_argument("--tasks", help="comma-separated (default: every task of the budget)")
    p.add_argument(
        "--data-dir",
        required=True,
        help="the folder holding glue_sst2/, glue_cola/, wnut17/, home_depot/ as published",
    )
    p.add_argument(
        "--seeds", default="3", help="N: seeds 1..N per cell; or a list such as 2,3 (those seeds)"
    )
    p.add_argument("--budget", default="cpu", help="cpu, gpu (experiments/budgets/) or a YAML file")
    p.add_argument(
        "--out", default="outputs/downstream", help="the suite's folder (rerun: continues)"
    )
    p.add_argument("--no-random", action="store_true", help="no random-weights row")
    p.set_defaults(func=_run)


def _run(a) -> None:
    from bert_lightning.experiments.downstream import downstream

    downstream(
        a.models,
        [t for t in a.tasks.split(",") if t] if a.tasks else None,
        a.data_dir,
        seeds=a.seeds,
        budget=a.budget,
        out=a.out,
        random=not a.no_random,
    )
