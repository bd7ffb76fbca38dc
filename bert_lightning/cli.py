"""The `bert-lightning` console script (also `python -m bert_lightning`): one subcommand per
module of `bert_lightning.commands`, each adding itself with `register(subparsers)`.
`pretrain` and `finetune` hand everything after their name to Hydra, as train.py and
finetune.py do. A user's mistake (a bad file, a wrong checkpoint) is reported as one line
`error: ...` with exit code 2; `--debug` (HYDRA_FULL_ERROR=1 for pretrain/finetune) shows the
traceback."""

from __future__ import annotations

import argparse
import importlib
import sys
from contextlib import nullcontext

from bert_lightning.commands.options import missing_columns_named_by_option
from bert_lightning.errors import reported
from bert_lightning.signals import stops_on_signals

# modules of bert_lightning.commands
COMMANDS = [
    "pretrain",
    "finetune",
    "evaluate",
    "interpolate",
    "score",
    "fill_mask",
    "embed",
    "export_hf",
    "export_onnx",
    "report",
    "downstream",
    "serve",
]
COMMANDS += ["download_c4", "brackets_data"]
HYDRA_COMMANDS = ("pretrain", "finetune")  # the rest of the command line is Hydra's
DRAINS = ("serve",)  # a server acts on the stop signals itself: it drains (serving.py)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in HYDRA_COMMANDS:
        importlib.import_module(f"bert_lightning.commands.{argv[0]}").run(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="bert-lightning", description=" ".join(__doc__.split()))
    debug_help = "show the traceback of an error (a user's mistake is otherwise one line)"
    parser.add_argument("--debug", action="store_true", help=debug_help)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"bert_lightning.commands.{name}").register(sub)
    for name, p in sub.choices.items():  # also after the command's name
        if name not in HYDRA_COMMANDS:  # SUPPRESS: no default to hide a `--debug` given before
            p.add_argument(
                "--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help
            )
    args = parser.parse_args(argv)
    # a stop signal ends a command at once, 128 + its number, saying it was asked for
    stops = nullcontext() if args.command in DRAINS else stops_on_signals(f"in {args.command}")
    with reported(args.debug), stops, missing_columns_named_by_option(args):
        args.func(args)
