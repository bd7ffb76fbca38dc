"""Callbacks of a run: last.ckpt at the final step, real-token throughput, progress over steps,
the model summary and the loss-curve plot."""

from __future__ import annotations

import csv
import logging
import sys
import time
from pathlib import Path

import lightning as L
from lightning.pytorch import callbacks as lightning_callbacks
from lightning.pytorch.callbacks import ModelSummary, ProgressBar
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_only

from bert_lightning.atomic import atomic_path
from bert_lightning.progress import eta_text, to_log_files
from bert_lightning.run_folder import METRICS, follow_moved_run
from bert_lightning.training.lightning_api import (
    every_n_steps,
    learning_rates,
    logs_this_step,
    ranks_at_epoch_end,
    save_last,
    save_ranked,
    saved_at_step,
    summary_table,
)
from bert_lightning.training.optim import budget_timer

log = logging.getLogger(__name__)


class ModelCheckpoint(lightning_callbacks.ModelCheckpoint):
    """Lightning's, with `last.ckpt` written at the step the fit ends on, however it ends
    (steps, epochs, `trainer.max_time`, early stopping): Lightning's writes it at the end only
    when it never wrote one, so a run stopped between checkpoints kept an older one. It is
    written in `on_train_end`, while the loaders' iterators still run: after `fit`, Lightning
    has shut them down, and a StatefulDataLoader asked for its state then starts a new
    iterator, with worker processes that nothing ends (the run would never exit). Its name is
    Lightning's, so the state it keeps in a checkpoint has the same key. A resumed run whose
    folder moved keeps its best and last checkpoints (`run_folder.follow_moved_run`).

    With `every_n_train_steps`, a step's save is `last.ckpt` alone (a crash's recovery), and
    the best checkpoint is ranked at each validation's end, by its score, `last.ckpt` saved
    again after it: Lightning's ranks each step's save by the last validation's score (the
    weights have moved since: `best-step11.ckpt` held step 12's weights at step 8's score),
    and then skips the validation at a step it saved."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        """Every N steps `last.ckpt`, needing no score (Lightning's would wait for the first
        validation of a process, a resumed one's too)."""
        n, step = every_n_steps(self), trainer.global_step
        if self.monitor is None or not n:
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if step and step % n == 0 and not saved_at_step(self, trainer) and not trainer.fast_dev_run:
            save_last(self, trainer)

    def on_validation_end(self, trainer, pl_module):
        if self.monitor is None or not every_n_steps(self):
            return super().on_validation_end(trainer, pl_module)
        if not ranks_at_epoch_end(self, trainer):
            save_ranked(self, trainer)

    def on_train_epoch_end(self, trainer, pl_module):
        """An epoch-end validation is ranked here, after early stopping's decision, which
        `last.ckpt` then holds."""
        if self.monitor is None or not every_n_steps(self):
            return super().on_train_epoch_end(trainer, pl_module)
        if ranks_at_epoch_end(self, trainer):
            save_ranked(self, trainer)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        state = (checkpoint.get("callbacks") or {}).get(self.state_key)
        if state and self.dirpath and trainer.ckpt_path:  # before load_state_dict
            follow_moved_run(state, self.dirpath, trainer.ckpt_path)

    def on_train_end(self, trainer, pl_module):
        if self.save_last:
            save_last(self, trainer)


class EarlyStopping(lightning_callbacks.EarlyStopping):
    """Lightning's, with the configured patience kept on resume: Lightning's takes the
    checkpoint's, so that `callbacks.early_stopping.patience=` given to a resumed run would be
    recorded and ignored. The count of validations without improvement is the checkpoint's."""

    def on_load_checkpoint(self, trainer, pl_module, checkpoint):
        """A fit this stopped stays stopped when resumed (after a stop in its test): Lightning
        keeps the decision's reason in the checkpoint, not the trainer's `should_stop`, and the
        fit would train on; unless the patience given to the resumed run outlasts the
        validations without improvement."""
        state = (checkpoint.get("callbacks") or {}).get(self.state_key) or {}
        reason = EarlyStoppingReason(state.get("stopping_reason", EarlyStoppingReason.NOT_STOPPED))
        patient = reason is EarlyStoppingReason.PATIENCE_EXHAUSTED and (
            state["wait_count"] < self.patience  # the configured one: before load_state_dict
        )
        if reason is not EarlyStoppingReason.NOT_STOPPED and not patient:
            trainer.should_stop = True

    def load_state_dict(self, state_dict):
        patience = self.patience
        super().load_state_dict(state_dict)
        if state_dict["patience"] != patience:  # Lightning writes it
            log.info(
                "early stopping: patience %d (callbacks.early_stopping.patience), the "
                "checkpoint's run had %d",
                *(patience, state_dict["patience"]),
            )
        self.patience = patience


class LearningRateMonitor(lightning_callbacks.LearningRateMonitor):
    """Lightning's, logged through the module with the step's other metrics, so that the rate
    of step k is in step k's row (`EncoderModule` numbers rows by steps done; Lightning's
    writes to the loggers directly, one step lower)."""

    def on_train_batch_start(self, trainer, pl_module, *args, **kwargs):
        if logs_this_step(trainer):
            pl_module.log_dict(learning_rates(self, trainer))


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

    def __init__(self, *, peak_flops: float | None):
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
        if not logs_this_step(trainer) and self.mark is not None:
            return
        now, counts = time.perf_counter(), self.counts.tolist()  # the one read
        if self.mark is not None and now > self.mark[0]:
            # ranks see equal shares on average
            rate = [
                (b - a) * trainer.world_size / (now - self.mark[0])
                for a, b in zip(self.mark[1], counts, strict=True)
            ]
            pl_module.log("train/tokens_per_s", rate[0])
            pl_module.log("train/samples_per_s", rate[1])
            if flops_fn:
                pl_module.log("train/flops_per_s", rate[2])
                if self.peak:
                    pl_module.log("train/mfu", rate[2] / (self.peak * trainer.world_size))
        self.mark = (now, counts)


def _fmt(v) -> str:
    v = float(v)
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


class StepProgressBar(ProgressBar):
    """Progress over the run's optimizer steps, not epochs (pretraining is bound by steps, and
    has no epoch count to show); the total is the fit's optimizer steps, also
    for a run bound by epochs (fine-tuning). On a terminal one tqdm bar, step / total with
    loss, tokens/s and ETA; otherwise (a file, a pipe, CI, SLURM logs) a plain line every
    `every` steps or `seconds` seconds, whichever comes first (a slow run is not silent for
    hours), since a bar redrawn in place leaves nothing readable there. Either way a
    line with the validation metrics after each validation. The lines go to stdout and into
    the run's log file (`to_log_files`). The metrics are read (a host sync) only when shown:
    every `refresh` steps on the bar; they are the `SHOWN` training figures, logged without
    Lightning's `prog_bar`, whose values it reads back to the host on every step. `tty`:
    None decides by stdout."""

    SHOWN = ("loss", "disc_acc", "tokens_per_s")  # the train/ figures a line shows

    def __init__(self, *, every: int, refresh: int, seconds: float, tty: bool | None = None):
        super().__init__()
        if every < 1 or refresh < 1 or seconds < 0:
            raise ValueError(
                f"callbacks.progress_bar: every={every}, refresh={refresh}, seconds={seconds}; "
                "expected every, refresh >= 1 and seconds >= 0"
            )
        self.every, self.refresh, self.seconds, self.tty = every, refresh, seconds, tty
        self.enabled, self.bar = True, None
        self.t0, self.step0, self.shown_step, self.last_line = 0.0, 0, -1, 0.0
        self.val_start = self.eval_said = 0.0
        self.eval_done = 0  # batches of the validation or test in progress

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

    def _training(self, trainer) -> dict[str, str]:
        metrics = trainer.callback_metrics  # tensors as logged: read here, when shown
        return {k: _fmt(metrics[f"train/{k}"]) for k in self.SHOWN if f"train/{k}" in metrics}

    def _open(self, total: int | None, done: int, desc: str, unit: str) -> None:
        """Counting from `done` of `total`: the bar on a terminal, else lines."""
        self.t0, self.step0 = time.perf_counter(), done
        self.shown_step, self.last_line = done, self.t0
        tty = sys.stdout.isatty() if self.tty is None else self.tty
        if tty:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=total, initial=done, desc=desc, unit=unit, dynamic_ncols=True, file=sys.stdout
            )

    def _line(self, done: int, total: int | None, due=False) -> list[str] | None:
        """Off a terminal, the start of a line when one is due (`due`, every `every`,
        `seconds` after the last one, at the end): `done/total`; None when not."""
        now = time.perf_counter()
        due = due or not done % self.every or done == total
        if not due and now - self.last_line < self.seconds:
            return None
        self.last_line = now
        return [f"{done}/{total}" if total else str(done)]

    def _eta(self, done: int, total: int | None, timer=None) -> list[str]:
        """The time left at the step rate so far, or on a time budget's clock (`timer`) if
        that ends sooner."""
        rate = (done - self.step0) / max(time.perf_counter() - self.t0, 1e-9)
        left = [(total - done) / rate] if total and rate > 0 else []
        left += [max(0.0, timer.time_remaining())] if timer is not None else []
        return [f"eta {eta_text(min(left))}"] if left else []

    def on_train_start(self, trainer, pl_module):
        if self.enabled:
            self._open(self._total(trainer), trainer.global_step, "train", "step")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if not self.enabled or step == self.shown_step:  # accumulating: the step is not done
            return
        self.shown_step = step
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            if step % self.refresh == 0:
                self.bar.set_postfix(self._training(trainer), refresh=False)
            return
        total = self._total(trainer)
        line = self._line(step, total, due=step == self.step0 + 1)  # the first: training began
        if line is None:
            return
        shown = self._training(trainer)
        line = ["step", *line, *(f"{k} {v}" for k, v in shown.items())]
        self.print(" ".join([*line, *self._eta(step, total, budget_timer(trainer))]))

    def on_validation_start(self, trainer, pl_module):
        self.val_start = self.eval_said = time.perf_counter()
        self.eval_done = 0

    def on_test_start(self, trainer, pl_module):
        self.on_validation_start(trainer, pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        if not trainer.sanity_checking:
            self._evaluating(f"validation at step {trainer.global_step}", trainer.num_val_batches)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self._evaluating("test", trainer.num_test_batches)

    def _evaluating(self, what: str, batches: list[int | float]) -> None:
        """A validation or test is not silent for long (a big one takes minutes): a line, on a
        terminal too, `seconds` after it began or after the last such line, with the batches
        done over its loaders."""
        now, self.eval_done = time.perf_counter(), self.eval_done + 1
        if not self.enabled or now - self.eval_said < self.seconds:
            return
        self.eval_said = now
        total = sum(batches)  # inf: a loader without a length
        of = f"/{int(total)}" if total != float("inf") else ""
        self.print(f"{what}: batch {self.eval_done}{of} ({now - self.val_start:.0f} s)")

    def on_validation_end(self, trainer, pl_module):
        """The metrics, and what the validation took (its share of a budget)."""
        if not self.enabled or trainer.sanity_checking:
            return
        shown = self._shown(trainer.callback_metrics, "val/")  # every val metric, not the bar's
        if shown:
            text = " ".join(f"{k} {v}" for k, v in shown.items())
            took = time.perf_counter() - self.val_start
            self.print(f"validation at step {trainer.global_step}: {text} ({took:.1f} s)")

    def print(self, *args, **kwargs) -> None:
        text = " ".join(map(str, args))
        if self.bar is not None:
            self.bar.write(text, file=sys.stdout)
        else:
            print(text, flush=True)
        to_log_files(text)

    def on_train_end(self, trainer, pl_module):
        self._close()

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class EvalProgressBar(StepProgressBar):
    """Progress over the batches of a validation, test or prediction run by itself
    (`bert-lightning evaluate`, an index's vectors), as StepProgressBar's over steps: on a
    terminal a tqdm bar, otherwise a line `batch 20/42 eta 0m03s` every `every` batches or
    `seconds` seconds and at the last (Lightning's default, a Rich bar, printed nothing there
    until the end, then a line of box characters). No metrics line: the command prints its own.
    Under DDP, rank 0's share (Lightning disables the other ranks' bars)."""

    def _start(self, batches: list[int | float], desc="evaluate") -> None:
        total = sum(batches)  # over the dataloaders; inf: one without a length
        self.total = int(total) if total != float("inf") else None
        if self.enabled:
            self._open(self.total, 0, desc, "batch")

    def _batch_end(self) -> None:
        if not self.enabled:
            return
        self.shown_step += 1
        if self.bar is not None:
            self.bar.update()
            return
        line = self._line(self.shown_step, self.total)
        if line is not None:
            self.print(" ".join(["batch", *line, *self._eta(self.shown_step, self.total)]))

    def on_validation_start(self, trainer, pl_module):
        self._start(trainer.num_val_batches)

    def on_test_start(self, trainer, pl_module):
        self._start(trainer.num_test_batches)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self._batch_end()

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self._batch_end()

    def on_validation_end(self, trainer, pl_module):
        self._close()

    def on_test_end(self, trainer, pl_module):
        self._close()

    def on_predict_start(self, trainer, pl_module):
        self._start(trainer.num_predict_batches, "predict")

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, *args):
        self._batch_end()

    def on_predict_end(self, trainer, pl_module):
        self._close()


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
        data = [(k, v) for k, v in summary_data if k != "FLOPs"]
        table = summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, 0, *data
        )
        log.info("\n" + "\n".join(ln for ln in table.splitlines() if "flops" not in ln.lower()))


def _csv_metrics(trainer: L.Trainer) -> Path | None:
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            logger.save()
            return Path(logger.log_dir) / METRICS
    return None


class LossCurvePlot(L.Callback):
    """Writes `filename` (the logged `keys` against step, e.g. train and validation loss) into
    the run folder from the CSV logger's `metrics.csv`, at the end of fit."""

    def __init__(self, *, filename: str, keys: list[str]):
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
        # the metric's name without its split: "loss" for train/ and val/loss, "acc" for val/acc
        names = dict.fromkeys(k.rsplit("/", 1)[-1] for k in self.keys)
        ax.set_xlabel("step")
        ax.set_ylabel(", ".join(names))
        ax.legend()
        ax.grid(alpha=0.3)
        save_figure(fig, out)
        plt.close(fig)


def save_figure(fig, path: Path) -> None:
    """Through a temporary name: a plot is never left half-written."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, bbox_inches="tight")
