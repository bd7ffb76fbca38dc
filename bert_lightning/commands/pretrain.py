"""`bert-lightning pretrain [overrides...]`: what `python train.py [overrides...]` runs, from an
installed package (the configs ship inside it). Hydra parses the overrides, so run folders,
`-m` multiruns and `--cfg job` behave as with train.py."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from bert_lightning.config import CONFIG_DIR, hydra_reported


@hydra.main(config_path=str(CONFIG_DIR), config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> float | None:
    from bert_lightning.training.pretrain import train

    with hydra_reported():
        return train(cfg)


def run(overrides: list[str]) -> None:
    sys.argv = ["bert-lightning pretrain", *overrides]  # what hydra.main reads
    hydra_main()


def register(sub) -> None:
    sub.add_parser(
        "pretrain",
        help="pretrain an encoder; Hydra overrides as train.py (model=bert_mini ...)",
        add_help=False,
    )
