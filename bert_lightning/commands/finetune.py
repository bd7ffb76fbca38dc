"""`bert-lightning finetune [overrides...]`: what `python finetune.py [overrides...]` runs, from
an installed package (the configs ship inside it). Hydra parses the overrides, so run folders,
`-m` multiruns and `--cfg job` behave as with finetune.py."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from bert_lightning.config import hydra_main


@hydra_main("finetune")
def main(cfg: DictConfig) -> float | None:
    from bert_lightning.training.finetune import best_val, finetune

    return best_val(finetune(cfg), cfg)


def run(overrides: list[str]) -> None:
    sys.argv = ["bert-lightning finetune", *overrides]  # what hydra.main reads
    main()


def register(sub) -> None:
    sub.add_parser(
        "finetune",
        help="fine-tune; Hydra overrides as finetune.py (task=... pretrained=...)",
        add_help=False,
    )
