"""Loggers whose package is an optional extra (conf/logger/wandb.yaml, tensorboard.yaml): a
missing package stops the run with a one-line install hint instead of a traceback."""

from __future__ import annotations

import importlib.util


def require(module: str, option: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise SystemExit(f'logger={option} needs {module}: pip install "bert-lightning[{option}]"')


def wandb(**kwargs):
    require("wandb", "wandb")
    from lightning.pytorch.loggers import WandbLogger

    return WandbLogger(**kwargs)


def tensorboard(**kwargs):
    require(
        "tensorboard", "tensorboard"
    )  # Lightning's logger writes through torch.utils.tensorboard
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(**kwargs)
