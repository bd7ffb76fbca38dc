"""The `bert-lightning` console script (also `python -m bert_lightning`): one subcommand per
module of `bert_lightning.commands`, each adding itself with `register(subparsers)`.
`pretrain` and `finetune` hand everything after their name to Hydra, as train.py and
finetune.py do. A user's mistake (a bad file, a wrong checkpoint) is reported as one line
`error: ...` with exit code 2; `--debug` (HYDRA_FULL_ERROR=1 for pretrain/finetune) shows the
traceback. `pretrain --help` and `finetune --help` (train.py's, finetune.py's) print Hydra's
help without Hydra's slow way to it (`hydra_help`)."""

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
    "index",
    "export_hf",
    "export_onnx",
    "report",
    "downstream",
    "serve",
]
COMMANDS += ["download_c4", "brackets_data"]
HYDRA_COMMANDS = ("pretrain", "finetune")  # the rest of the command line is Hydra's
DRAINS = ("serve",)  # a server acts on the stop signals itself: it drains (serving.py)
HELP_FLAGS = ("--help", "-h")

# Hydra's help (hydra/conf/hydra/help/default.yaml), as it prints it
HYDRA_HELP = """{job} is powered by Hydra.

== Configuration groups ==
Compose your configuration from those groups (group=option)

{groups}

== Config ==
Override anything in the config (foo.bar=value)

{config}

Powered by Hydra (https://hydra.cc)
Use --hydra-help to view Hydra specific help

"""


def hydra_help(config_name: str, job: str) -> bool:
    """Hydra's `--help` of a Hydra entry (`pretrain`, `finetune`, train.py, finetune.py) for the
    config `config_name` and the overrides on the command line, the same text: Hydra lists the
    config groups by composing the config once per group (seconds), read off conf/ here.
    False, printing nothing, where the command line is more than `--help` and overrides
    (`--resolve`, `-cn`, `hydra.*` keys) or Hydra would report a mistake: Hydra's then."""
    argv = sys.argv[1:]
    overrides = [a for a in argv if a not in HELP_FLAGS]
    if len(overrides) == len(argv) or any(
        a.startswith("-") or "hydra" in a.partition("=")[0] for a in overrides
    ):
        return False
    from hydra.errors import HydraException
    from omegaconf import OmegaConf

    from bert_lightning.config import compose

    try:
        cfg = compose(config_name, overrides)
    except HydraException:
        return False
    print(HYDRA_HELP.format(job=job, groups=config_groups(), config=OmegaConf.to_yaml(cfg)))
    return True


def config_groups() -> str:
    """Hydra's list of the config groups: `group: option, ...` a line, in order."""
    from bert_lightning.shipped import CONFIG_DIR

    groups: dict[str, list[str]] = {}
    for file in CONFIG_DIR.rglob("*.yaml"):
        group = file.parent.relative_to(CONFIG_DIR).as_posix()
        if group != ".":
            groups.setdefault(group, []).append(file.stem)
    return "".join(f"{g}: {', '.join(sorted(groups[g]))}\n" for g in sorted(groups))


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
