"""Hydra callbacks (`hydra.callbacks` in conf/train.yaml)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from bert_lightning.atomic import atomic_path


class MultirunSummary(Callback):
    """After a `-m` sweep, `multirun_summary.csv` in the sweep folder: one row per job (number,
    overrides, the value train() returned: the last validation loss), so jobs compare at a
    glance without opening each folder. Overrides that all jobs share are left out (they are in
    multirun.yaml). Rows are gathered in the Hydra process, which is where the basic launcher
    (and the Optuna sweeper over it) runs the jobs."""

    FILENAME = "multirun_summary.csv"

    def __init__(self, metric: str = "val/loss") -> None:
        self.metric = metric
        self.rows: list[dict[str, Any]] = []

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:  # a single run has no job number, no sweep
            return
        ok = job_return.status == JobStatus.COMPLETED
        value = job_return.return_value if ok else None  # that of a failure re-raises it
        self.rows.append(
            {
                "job": config.hydra.job.num,
                "overrides": list(job_return.overrides or []),
                self.metric: "" if value is None else value,
                "status": job_return.status.name,
            }
        )

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.rows:
            return
        shared = set.intersection(*(set(r["overrides"]) for r in self.rows))
        if len(self.rows) == 1:
            shared = set()
        rows = [
            {**r, "overrides": " ".join(o for o in r["overrides"] if o not in shared)}
            for r in sorted(self.rows, key=lambda r: r["job"])
        ]
        path = Path(config.hydra.sweep.dir) / self.FILENAME
        with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


class PlainOptunaLog(Callback):
    """Optuna's log lines (`hparams_search=mlm_optuna`) through Python's logging, as Hydra's:
    Optuna's own handler colours them with ANSI codes on stderr even off a terminal, where
    they land in the log files of a redirected sweep (SLURM, `> sweep.log 2>&1`)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        import optuna

        optuna.logging.disable_default_handler()
        optuna.logging.enable_propagation()
