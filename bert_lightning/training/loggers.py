"""The run's loggers: the CSV logger behind `metrics.csv` (always on), and the loggers whose
package is an optional extra (conf/logger/wandb.yaml, tensorboard.yaml): a missing package stops
the run with a one-line install hint instead of a traceback."""

from __future__ import annotations

import csv
import importlib.util

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from bert_lightning.errors import UserError


class _AppendingWriter(ExperimentWriter):
    """Lightning's writer warns about, then deletes, a `metrics.csv` it finds. In a run folder
    other files are expected (`.hydra/`, the log, checkpoints), and a `metrics.csv` is the run's
    own, from before a resume (`keep_metrics_through` cut it at the resumed step): appended to,
    its columns kept."""

    def _check_log_dir_exists(self) -> None:
        if self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])


class RunCSVLogger(CSVLogger):
    """`metrics.csv` in the run folder, continued (not replaced) by a resumed run."""

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


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
