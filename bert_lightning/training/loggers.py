"""The run's loggers: the CSV logger behind `metrics.csv` (always on), and the loggers whose
package is an optional extra (conf/logger/wandb.yaml, tensorboard.yaml): a missing package stops
the run with a one-line install hint instead of a traceback."""

from __future__ import annotations

import importlib.util

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from bert_lightning.errors import UserError
from bert_lightning.training.lightning_api import appending_csv_experiment


class RunCSVLogger(CSVLogger):
    """`metrics.csv` in the run folder, continued (not replaced) by a resumed run: Lightning's
    writer would warn about, then delete, the run's own file from before a resume
    (`keep_metrics_through` cut it at the resumed step; `.hydra/`, the log and checkpoints are
    expected there too)."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        return appending_csv_experiment(self)


def require(module: str, option: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise UserError(f'logger={option} needs {module}: pip install "bert-lightning[{option}]"')


def wandb(**kwargs):
    require("wandb", "wandb")
    from lightning.pytorch.loggers import WandbLogger

    return WandbLogger(**kwargs)


def tensorboard(**kwargs):
    require("tensorboard", "tensorboard")  # Lightning's logger writes through torch's writer
    from lightning.pytorch.loggers import TensorBoardLogger

    return TensorBoardLogger(**kwargs)
