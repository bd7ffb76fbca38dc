"""`bert-lightning pretrain [overrides...]`: the Hydra entry of a pretraining run, which
`python train.py [overrides...]` calls too (the installed package ships the configs). Hydra
parses the overrides: run folders, `-m` multiruns and `--cfg job` are train.py's."""

from __future__ import annotations

import sys
from importlib.util import find_spec

from omegaconf import DictConfig

from bert_lightning.config import hydra_main


@hydra_main("train")
def main(cfg: DictConfig) -> float | None:
    from bert_lightning.training.pretrain import train  # no torch for --help, --cfg

    return train(cfg)


def run(overrides: list[str]) -> None:
    """`bert-lightning pretrain` (the console script, `python -m bert_lightning`). Lightning
    starts a multi-process run's other ranks as what `__main__` ran, with the same overrides:
    this module, run by `-m`, which a console script or the `cli` module would not be."""
    sys.argv = ["bert-lightning pretrain", *overrides]  # what hydra.main reads
    sys.modules["__main__"].__spec__ = find_spec(__name__)
    main()


def register(sub) -> None:
    sub.add_parser(
        "pretrain",
        help="pretrain an encoder; Hydra overrides as train.py (model=bert_mini ...)",
        add_help=False,
    )


if __name__ == "__main__":  # the other ranks of a multi-process run started by `run`
    main()
