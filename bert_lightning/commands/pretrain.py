"""`bert-lightning pretrain [overrides...]`: what `python train.py [overrides...]` runs, from an
installed package (the configs ship inside it). Hydra parses the overrides, so run folders,
`-m` multiruns and `--cfg job` behave as with train.py."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from bert_lightning.config import hydra_main


@hydra_main("train")
def main(cfg: DictConfig) -> float | None:
    from bert_lightning.training.pretrain import train

    return train(cfg)


def run(overrides: list[str]) -> None:
    sys.argv = ["bert-lightning pretrain", *overrides]  # what hydra.main reads
    main()


def register(sub) -> None:
    sub.add_parser(
        "pretrain",
        help="pretrain an encoder; Hydra overrides as train.py (model=bert_mini ...)",
        add_help=False,
    )
