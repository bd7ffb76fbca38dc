"""`bert-lightning report brackets`: the brackets sanity suite (tables and plots)."""

from __future__ import annotations

SUITES = ("brackets",)


def register(sub) -> None:
    p = sub.add_parser(
        "report", help="run a sanity suite: tables beside the published numbers, and plots"
    )
    p.add_argument("suite", choices=SUITES)
    p.add_argument("out_dir", nargs="?", default="outputs/brackets_report")
    p.add_argument("overrides", nargs="*", help="extra train.py overrides for every run")
    p.set_defaults(func=_main)


def _main(args) -> None:
    from bert_lightning.experiments.brackets import report as brackets

    brackets.main([args.out_dir, *args.overrides])
