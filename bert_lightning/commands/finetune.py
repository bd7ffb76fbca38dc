"""`bert-lightning finetune [overrides...]`: the Hydra entry of a fine-tuning run, which
`python finetune.py [overrides...]` calls too (the installed package ships the configs). Hydra
parses the overrides: run folders, `-m` multiruns and `--cfg job` are finetune.py's."""

from __future__ import annotations

import sys
from importlib.util import find_spec

from omegaconf import DictConfig

from bert_lightning.config import hydra_main


@hydra_main("finetune")
def main(cfg: DictConfig) -> float | None:
    from bert_lightning.training.finetune import best_val, finetune  # no torch for --help, --cfg

    return best_val(finetune(cfg), cfg)


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
        help="fine-tune; Hydra overrides as finetune.py (task=... pretrained=...)",
        add_help=False,
    )


if __name__ == "__main__":  # the other ranks of a multi-process run started by `run`
    main()
