"""Callbacks of a run: real-token throughput on the progress bar, and the loss-curve plot."""

from __future__ import annotations

import csv
import os
import time
from collections import deque
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only


class TokenThroughput(L.Callback):
    """Logs `train/tokens_per_s` (real tokens, padding excluded) and `train/samples_per_s`,
    averaged over the last `window` steps, wall clock between step ends (data loading
    included)."""

    def __init__(self, window: int = 20):
        self.window = window
        self.marks: deque = deque(maxlen=window + 1)  # (time, tokens so far, samples so far)

    def on_train_start(self, trainer, pl_module):
        self.marks.clear()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        mask = batch.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else batch["input_ids"].numel()
        samples = batch["input_ids"].size(0) * trainer.world_size
        tokens *= trainer.world_size  # ranks see equal shares on average
        _, n_tok, n_smp = self.marks[-1] if self.marks else (None, 0, 0)
        self.marks.append((time.perf_counter(), n_tok + tokens, n_smp + samples))
        if len(self.marks) < 2:
            return
        (t0, tok0, smp0), (t1, tok1, smp1) = self.marks[0], self.marks[-1]
        pl_module.log("train/tokens_per_s", (tok1 - tok0) / (t1 - t0), prog_bar=True)
        pl_module.log("train/samples_per_s", (smp1 - smp0) / (t1 - t0))


def _csv_metrics(trainer: L.Trainer) -> Path | None:
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            logger.save()
            return Path(logger.log_dir) / "metrics.csv"
    return None


class LossCurvePlot(L.Callback):
    """Writes `loss_curve.png` (train and validation loss against step) into the run folder
    from the CSV logger's `metrics.csv`, at the end of fit."""

    def __init__(self, filename: str = "loss_curve.png", keys=("train/loss", "val/loss")):
        self.filename, self.keys = filename, tuple(keys)

    @rank_zero_only
    def on_fit_end(self, trainer, pl_module):
        metrics = _csv_metrics(trainer)
        if metrics is None or not metrics.is_file():
            return
        self.plot(metrics, Path(trainer.default_root_dir) / self.filename)

    def plot(self, metrics_csv: Path, out: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        series = {k: ([], []) for k in self.keys}
        with open(metrics_csv, newline="") as f:
            for row in csv.DictReader(f):
                for k, (steps, values) in series.items():
                    if row.get(k):
                        steps.append(int(row["step"]))
                        values.append(float(row[k]))
        fig, ax = plt.subplots(figsize=(6, 4))
        for k, (steps, values) in series.items():
            if values:
                ax.plot(steps, values, marker="o" if len(values) < 30 else None, label=k)
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        tmp = out.with_name(f".{out.stem}.tmp{os.getpid()}{out.suffix}")
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
        plt.close(fig)
        os.replace(tmp, out)
