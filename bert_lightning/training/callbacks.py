"""Callbacks of a run: real-token throughput, progress over steps, the model summary and the
loss-curve plot."""

from __future__ import annotations

import csv
import logging
import sys
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelSummary, ProgressBar
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only

from bert_lightning.atomic import atomic_path
from bert_lightning.training.optim import budget_timer

log = logging.getLogger(__name__)

# Dense (no sparsity) bf16/fp16 tensor-core peaks from NVIDIA's datasheets, FLOP/s, matched by
# substring of torch.cuda.get_device_name (most specific first). Lightning's own table lists the
# sparse figures for the H200 and misses its plain name, hence ours.
DEVICE_BF16_PEAK = (
    ("h200", 989e12),
    ("h100 pcie", 756e12),
    ("h100", 989e12),
    ("a100", 312e12),
    ("l40s", 362e12),
    ("l4", 121e12),
)


def device_peak_flops(device, precision: str | int) -> float | None:
    """Peak FLOP/s of one device for a Lightning `precision`, or None where unknown (a CPU,
    a GPU not in the table, fp32): MFU is then omitted rather than guessed."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not str(precision).startswith(("bf16", "16")):
        return None
    name = torch.cuda.get_device_name(device).lower()
    return next((peak for key, peak in DEVICE_BF16_PEAK if key in name), None)


class TokenThroughput(L.Callback):
    """Logs `train/tokens_per_s` (real tokens, padding excluded), `train/samples_per_s` and,
    when the module has `flops_per_batch(batch)`, `train/flops_per_s` (useful FLOPs) and
    `train/mfu` against `peak_flops` (per device; None: the device table, and no MFU where the
    peak is unknown).

    The counts add up on the device and are read once per logged step (`log_every_n_steps`):
    a host-device synchronisation on every step would stall a GPU's queue. Each figure is the
    rate over the steps since the previous read, wall clock between the reads (data loading
    included)."""

    def __init__(self, peak_flops: float | None = None):
        self.peak_flops = peak_flops
        self.peak: float | None = None
        self.counts = None  # (3,) tokens, samples, FLOPs since the start of the fit, on device
        self.mark: tuple[float, list[float]] | None = None  # (time, counts) at the last read

    def on_train_start(self, trainer, pl_module):
        self.counts, self.mark = None, None
        self.peak = self.peak_flops or device_peak_flops(
            pl_module.device, trainer.precision_plugin.precision
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        import torch

        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
        tokens = mask.sum() if mask is not None else torch.tensor(ids.numel(), device=ids.device)
        flops_fn = getattr(pl_module, "flops_per_batch", None)
        flops = flops_fn(batch) if flops_fn else tokens.new_zeros(())
        step = torch.stack([tokens, tokens.new_tensor(ids.size(0)), flops]).double()  # (3,)
        self.counts = step if self.counts is None else self.counts + step
        if not trainer._logger_connector.should_update_logs and self.mark is not None:
            return
        now, counts = time.perf_counter(), self.counts.tolist()  # the one read
        if self.mark is not None and now > self.mark[0]:
            # ranks see equal shares on average
            rate = [
                (b - a) * trainer.world_size / (now - self.mark[0])
                for a, b in zip(self.mark[1], counts, strict=True)
            ]
            pl_module.log("train/tokens_per_s", rate[0], prog_bar=True)
            pl_module.log("train/samples_per_s", rate[1])
            if flops_fn:
                pl_module.log("train/flops_per_s", rate[2])
                if self.peak:
                    pl_module.log("train/mfu", rate[2] / (self.peak * trainer.world_size))
        self.mark = (now, counts)


def _fmt(v) -> str:
    v = float(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def eta_text(seconds: float) -> str:
    """`1h05m` or `4m09s`: a progress line's time left."""
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class StepProgressBar(ProgressBar):
    """Progress over the run's optimizer steps, not epochs (pretraining counts steps; an
    epoch count of -1 showed as `Epoch 0/-2`); the total is the fit's optimizer steps, also
    for a run bound by epochs (fine-tuning). On a terminal one tqdm bar, step / total with
    loss, tokens/s and ETA; otherwise (a file, a pipe, CI, SLURM logs) a plain line every
    `every` steps or `seconds` seconds, whichever comes first (a slow run is not silent for
    hours), since a bar redrawn in place leaves nothing readable there. Either way a
    line with the validation metrics after each validation. Both go to stdout, beside the
    run's log. The metrics are read (a host sync) only when shown: every `refresh` steps on
    the bar. `tty`: None decides by stdout."""

    def __init__(
        self, every: int = 50, refresh: int = 10, seconds: float = 30.0, tty: bool | None = None
    ):
        super().__init__()
        if every < 1 or refresh < 1 or seconds <= 0:
            raise ValueError(
                f"callbacks.progress_bar: every={every}, refresh={refresh}, seconds={seconds}; "
                "expected every, refresh >= 1 and seconds > 0"
            )
        self.every, self.refresh, self.seconds, self.tty = every, refresh, seconds, tty
        self.enabled, self.bar = True, None
        self.t0, self.step0, self.shown_step, self.last_line = 0.0, 0, -1, 0.0

    def disable(self) -> None:
        self.enabled = False

    def enable(self) -> None:
        self.enabled = True

    @property
    def is_enabled(self) -> bool:
        return self.enabled

    @staticmethod
    def _total(trainer) -> int | None:
        total = trainer.estimated_stepping_batches  # max_steps, or what the epochs make
        return int(total) if total != float("inf") else None

    @staticmethod
    def _shown(metrics: dict, prefix: str) -> dict[str, str]:
        return {k[len(prefix) :]: _fmt(v) for k, v in metrics.items() if k.startswith(prefix)}

    def on_train_start(self, trainer, pl_module):
        if not self.enabled:
            return
        self.t0, self.step0 = time.perf_counter(), trainer.global_step
        self.shown_step, self.last_line = trainer.global_step, self.t0
        tty = sys.stdout.isatty() if self.tty is None else self.tty
        if tty:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=self._total(trainer),
                initial=trainer.global_step,
                desc="train",
                unit="step",
                dynamic_ncols=True,
                file=sys.stdout,
            )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if not self.enabled or step == self.shown_step:  # accumulating: the step is not done
            return
        self.shown_step = step
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if step % self.refresh == 0:
                metrics = self.get_metrics(trainer, pl_module)
                self.bar.set_postfix(self._shown(metrics, "train/"), refresh=False)
            return
        total, now = self._total(trainer), time.perf_counter()
        if step % self.every and step != total and now - self.last_line < self.seconds:
            return
        self.last_line = now
        rate = (step - self.step0) / max(now - self.t0, 1e-9)
        shown = self._shown(self.get_metrics(trainer, pl_module), "train/")
        line = [f"step {step}/{total}" if total else f"step {step}"]
        line += [f"{k} {v}" for k, v in shown.items()]
        timer = budget_timer(trainer)
        if timer is not None:  # a run on a time budget ends when its time does
            line.append(f"eta {eta_text(max(0.0, timer.time_remaining()))}")
        elif total and rate > 0:
            line.append(f"eta {eta_text((total - step) / rate)}")
        print(" ".join(line), flush=True)

    def on_validation_end(self, trainer, pl_module):
        if not self.enabled or trainer.sanity_checking:
            return
        shown = self._shown(trainer.callback_metrics, "val/")  # every val metric, not the bar's
        if shown:
            text = " ".join(f"{k} {v}" for k, v in shown.items())
            self.print(f"validation at step {trainer.global_step}: {text}")

    def print(self, *args, **kwargs) -> None:
        text = " ".join(map(str, args))
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)

    def on_train_end(self, trainer, pl_module):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class FlopFreeModelSummary(ModelSummary):
    """Lightning's summary table without its FLOPs column and total: it counts FLOPs only
    with an example input (it printed `Total FLOPs: 0`); the throughput callback logs the
    FLOPs of our own step instead."""

    @staticmethod
    def summarize(
        summary_data,
        total_parameters,
        trainable_parameters,
        model_size,
        total_training_modes,
        total_flops,
        **kwargs,
    ) -> None:
        from lightning.pytorch.utilities.model_summary.model_summary import (
            _format_summary_table,
        )

        data = [(k, v) for k, v in summary_data if k != "FLOPs"]
        table = _format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, 0, *data
        )
        log.info("\n" + "\n".join(ln for ln in table.splitlines() if "flops" not in ln.lower()))


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
        save_figure(fig, out)
        plt.close(fig)


def save_figure(fig, path: Path) -> None:
    """Through a temporary name: a plot is never left half-written."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
