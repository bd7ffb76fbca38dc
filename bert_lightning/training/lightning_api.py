"""The one door to Lightning's private names (pyproject pins `lightning<2.7`): every `_`-name of
Lightning the package reads, calls or overrides is here, each behind a function that says what
it reads and why the public API does not give it. A release that moves one fails here with one
line naming the release and the name (`LightningMoved`); tests/test_lightning_api.py checks
each on a real fit, tests/test_private_api.py that nothing else in the package touches such a
name. (Hydra's, OmegaConf's, torch's and LitServe's are behind bert_lightning/private_api.py.)"""

from __future__ import annotations

import csv
from typing import Any

import lightning
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from bert_lightning.private_api import LibraryMoved, reach


class LightningMoved(LibraryMoved):
    """The installed Lightning lacks a private name this module reads."""

    door = "bert_lightning/training/lightning_api.py"


def _private(obj: Any, *path: str) -> Any:
    """`obj.path[0].path[1]...`, or LightningMoved naming the first missing name."""
    return reach(obj, path, f"Lightning {lightning.__version__}", LightningMoved)


def logs_this_step(trainer) -> bool:
    """Whether the loggers write a row at this training batch (every `log_every_n_steps`
    steps, and when the fit stops): Lightning decides it in its private logger connector, on
    its private count of the batches that stepped."""
    return _private(trainer, "_logger_connector", "should_update_logs")


def batches_stepped(trainer) -> int:
    """The batches that ran an optimizer step so far, the step Lightning writes a training row
    at (one less than the steps done, in `on_train_batch_end`). It is the fit loop's private
    counter, which a checkpoint restores; the public `global_step` counts the steps of every
    optimizer."""
    return _private(trainer, "fit_loop", "epoch_loop", "_batches_that_stepped")


def validation_progress(trainer):
    """The fit's validation loop's batch counts, which a checkpoint records: Lightning keeps
    them on its loops, private classes, whose public attributes it may rename at will."""
    return _private(trainer, "fit_loop", "epoch_loop", "val_loop", "batch_progress")


def validates_after_step(trainer) -> bool:
    """Whether the fit validates once this training batch is done: Lightning decides it after
    the callbacks' `on_train_batch_end`, in a private method of its epoch loop (on its private
    data fetcher), and skips it when a checkpoint saved before it is resumed."""
    loop = _private(trainer, "fit_loop", "epoch_loop")
    fetcher = _private(trainer, "fit_loop", "_data_fetcher")
    return _private(loop, "_should_check_val_fx")(fetcher) and not _private(loop, "_skip_next_val")


def count_the_fit_done(trainer) -> None:
    """Counts a resumed fit that had no step left as the fit that ran to its end counted
    itself. Its checkpoint was saved at the last step, before Lightning counted that batch
    and its epoch done; a fit with nothing to run skips the restart's corrections, so what
    follows it (a test) would be logged a step and an epoch early. The counters are private:
    the batches that stepped (one per step of the one optimizer every run has) and the epoch's
    progress."""
    loop = _private(trainer, "fit_loop", "epoch_loop")
    _private(loop, "_batches_that_stepped")
    loop._batches_that_stepped = trainer.global_step
    epochs = _private(trainer, "fit_loop", "epoch_progress", "current")
    epochs.processed = epochs.completed = epochs.started


def log_step_row(trainer, outputs, batch, batch_idx: int) -> None:
    """What Lightning does after the callbacks' `on_train_batch_end`, which a stop raised there
    skips: the module's hook (it logs the row's step), then the step's row to the loggers, which
    its private logger connector holds until then."""
    trainer.lightning_module.on_train_batch_end(outputs, batch, batch_idx)
    _private(trainer, "_logger_connector", "update_train_step_metrics")()


def save_deferred(checkpoint) -> bool:
    """Whether a ModelCheckpoint put off its save at this step to the validation's end (its
    monitored metric not yet fresh): a private flag, which its state in a checkpoint leaves out."""
    return _private(checkpoint, "_defer_save_until_validation")


def defer_save(checkpoint) -> None:
    """A ModelCheckpoint's save put off to the end of the next validation (`save_deferred`)."""
    _private(checkpoint, "_defer_save_until_validation")
    checkpoint._defer_save_until_validation = True


def set_data_parallel_size(strategy, size: int) -> None:
    """ModelParallelStrategy's data-parallel mesh size: known only once the processes are set
    up (`setup_environment`), after which Lightning keeps it in a private attribute alone."""
    _private(strategy, "_data_parallel_size")
    strategy._data_parallel_size = size


def budget_seconds(timer) -> float:
    """A Timer's `duration` (`trainer.max_time`) in seconds, as it parsed it: it keeps the
    figure only privately (`time_remaining` reads the clock again)."""
    return _private(timer, "_duration")


def set_budget_seconds(timer, seconds: float) -> None:
    """A Timer's duration, shortened: the time it leaves for what its clock does not count."""
    _private(timer, "_duration")
    timer._duration = seconds


def skip_this_validation(trainer) -> None:
    """No validation at this training batch, whatever the cadence says: the epoch loop's
    private flag, which it reads once, right after the batch's end hooks, and clears."""
    _private(trainer, "fit_loop", "epoch_loop", "_skip_next_val")
    trainer.fit_loop.epoch_loop._skip_next_val = True


def learning_rates(monitor, trainer) -> dict[str, float]:
    """The rates a LearningRateMonitor logs at a step, by its names: it computes them in a
    private method and writes them to the loggers itself."""
    return _private(monitor, "_extract_stats")(trainer, "step")


def save_last(callback, trainer) -> None:
    """`last.ckpt` of a ModelCheckpoint at the trainer's step, unless it saved at that step
    already: Lightning writes it (the name, the link or copy, the removal of the previous one)
    in private methods that only its own hooks call."""
    if _private(callback, "_last_global_step_saved") != trainer.global_step:
        candidates = _private(callback, "_monitor_candidates")(trainer)
        _private(callback, "_save_last_checkpoint")(trainer, candidates)


def every_n_steps(callback) -> int:
    """A ModelCheckpoint's `every_n_train_steps` (0: none), which it keeps in a private
    attribute."""
    return max(_private(callback, "_every_n_train_steps"), 0)


def ranks_at_epoch_end(callback, trainer) -> bool:
    """Whether a ModelCheckpoint takes the validation at an epoch's end in `on_train_epoch_end`
    (after early stopping decided there), not at the validation's end: Lightning decides it in
    a private method."""
    return _private(callback, "_should_save_on_train_epoch_end")(trainer)


def saved_at_step(callback, trainer) -> bool:
    """Whether a ModelCheckpoint saved at this step already: its private record of the step."""
    return _private(callback, "_last_global_step_saved") == trainer.global_step


def save_ranked(callback, trainer) -> None:
    """At a fit's validation's end: a ModelCheckpoint's top-k save by the metrics just
    validated, then `last.ckpt` again where a checkpoint was saved at this step (before the
    validation, or the top-k one) or put off to here, so that it holds what the validation
    decided. Lightning's own hook skips a step saved already, and ranks only a save it put
    off; its save methods are private, called by its hooks alone."""
    if trainer.fast_dev_run or trainer.sanity_checking or trainer.state.fn != "fit":
        return
    deferred = _private(callback, "_defer_save_until_validation")
    candidates = _private(callback, "_monitor_candidates")(trainer)
    _private(callback, "_save_topk_checkpoint")(trainer, candidates)
    if deferred or saved_at_step(callback, trainer):
        _private(callback, "_save_last_checkpoint")(trainer, candidates)
    callback._defer_save_until_validation = False


def summary_table(*args) -> str:
    """Lightning's model-summary table as text, from ModelSummary.summarize's arguments in
    order (the summary rows last): a private function builds it, and the public `summarize`
    logs it with the FLOPs that ours leaves out."""
    from lightning.pytorch.utilities.model_summary import model_summary

    return _private(model_summary, "_format_summary_table")(*args)


class _AppendingWriter(ExperimentWriter):
    """Lightning's writer warns about, then deletes, a `metrics.csv` it finds (its private
    `_check_log_dir_exists`, which its constructor calls): this one reads its columns, and
    appends."""

    def _check_log_dir_exists(self) -> None:
        fs = _private(self, "_fs")
        if fs.isfile(self.metrics_file_path):
            with fs.open(self.metrics_file_path, "r", newline="") as f:
                self.metrics_keys = next(csv.reader(f), [])


def appending_csv_experiment(logger: CSVLogger) -> ExperimentWriter:
    """A CSVLogger's writer (its `experiment`) made, the first time, as one that continues the
    `metrics.csv` it finds: CSVLogger keeps its writer, and the file system it makes the folder
    on, in private attributes, and takes no writer of ours."""
    _private(ExperimentWriter, "_check_log_dir_exists")  # else ours overrides nothing
    if _private(logger, "_experiment") is None:
        _private(logger, "_fs").makedirs(logger.root_dir, exist_ok=True)
        logger._experiment = _AppendingWriter(log_dir=logger.log_dir)
    return logger._experiment
