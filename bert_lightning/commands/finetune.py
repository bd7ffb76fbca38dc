"""`bert-lightning finetune [overrides...]`: the Hydra entry of a fine-tuning run, which
`python finetune.py [overrides...]` calls too (the installed package ships the configs). Hydra
parses the overrides: run folders, `-m` multiruns and `--cfg job` are finetune.py's."""

from __future__ import annotations

import sys

from omegaconf import DictConfig

from bert_lightning.config import hydra_main


@hydra_main("finetune")
def main(cfg: DictConfig) -> float | None:
    from bert_lightning.training.finetune import best_val, finetune  # no torch for --help, --cfg

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
