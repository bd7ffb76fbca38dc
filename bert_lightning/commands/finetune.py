"""`bert-lightning finetune [overrides...]`: the Hydra entry of a fine-tuning run, which
`python finetune.py [overrides...]` calls too (the installed package ships the configs). Hydra
parses the overrides: run folders, `-m` multiruns and `--cfg job` are finetune.py's."""

from __future__ import annotations

import sys
from importlib.util import find_spec
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig


def task(cfg: DictConfig) -> float | None:
    """What the run does, once Hydra composed its config: no torch for --help, --cfg."""
    from bert_lightning.training.finetune import best_val, finetune

    return best_val(finetune(cfg), cfg)


def main(job: str | None = None) -> None:
    """The Hydra entry (`config.hydra_main`), made when it runs: Hydra is imported then, not
    when `bert-lightning --help` builds this command's parser. `--help` is answered first."""
    from bert_lightning.cli import hydra_help

    if hydra_help("finetune", job or "finetune"):
        return
    from bert_lightning.config import hydra_main

    hydra_main("finetune")(task)(job)


def run(overrides: list[str]) -> None:
    """`bert-lightning finetune` (the console script, `python -m bert_lightning`). Lightning
    starts a multi-process run's other ranks as what `__main__` ran, with the same overrides:
    this module, run by `-m`, which a console script or the `cli` module would not be."""
    sys.argv = ["bert-lightning finetune", *overrides]  # what hydra.main reads
    sys.modules["__main__"].__spec__ = find_spec(__name__)
    main()


def register(sub) -> None:
    sub.add_parser(
        "finetune",
        help="fine-tune; Hydra overrides as finetune.py (task=... init_from=...)",
        add_help=False,
    )


if __name__ == "__main__":  # the other ranks of a multi-process run started by `run`
    main()
