"""The `bert-lightning` console script (also `python -m bert_lightning`): one subcommand per
module of `bert_lightning.commands`, each adding itself with `register(subparsers)`."""

from __future__ import annotations

import argparse
import importlib

# modules of bert_lightning.commands
COMMANDS = ["score", "fill_mask", "embed", "export_hf", "report", "download_c4"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bert-lightning", description=" ".join(__doc__.split()))
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"bert_lightning.commands.{name}").register(sub)
    args = parser.parse_args(argv)
    args.func(args)
