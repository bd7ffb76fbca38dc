"""The `bert-lightning` console script (also `python -m bert_lightning`): one subcommand per
module of `bert_lightning.commands`, each adding itself with `register(subparsers)`.
`pretrain` and `finetune` hand everything after their name to Hydra, as train.py and
finetune.py do."""

from __future__ import annotations

import argparse
import importlib
import sys

# modules of bert_lightning.commands
COMMANDS = ["pretrain", "finetune", "score", "fill_mask", "embed", "export_hf", "report"]
COMMANDS += ["download_c4", "brackets_data"]
HYDRA_COMMANDS = ("pretrain", "finetune")  # the rest of the command line is Hydra's


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in HYDRA_COMMANDS:
        importlib.import_module(f"bert_lightning.commands.{argv[0]}").run(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="bert-lightning", description=" ".join(__doc__.split()))
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"bert_lightning.commands.{name}").register(sub)
    args = parser.parse_args(argv)
    args.func(args)
