"""A run stopped by a signal during its fit: Ctrl-C, a scheduler's SIGTERM or SLURM's SIGUSR1
save the step in progress and end the run with one line, and the loaders' workers end with it.
(Outside the fit the run's `Stops`, signals.py, end it at once.)"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Timer

from bert_lightning.private_api import end_workers
from bert_lightning.signals import Interrupted, Stops, active_stops
from bert_lightning.training.lightning_api import (
    defer_save,
    log_step_row,
    save_deferred,
    save_last,
    saved_at_step,
    validates_after_step,
    validation_progress,
)

__all__ = ["Interrupted", "SaveOnInterrupt", "shut_down_workers"]  # Interrupted: as before


class SaveOnInterrupt(L.Callback):
    """SIGINT (Ctrl-C), SIGTERM (most schedulers' preemption notice) or SIGUSR1 (SLURM's
    `--signal=USR1@<seconds>`) during a fit (the run's `Stops` deferred to it) ends the run
    once the optimizer step in progress is done: `last.ckpt` is written at that step
    (atomically) and the run stops with one line naming the step and the checkpoint to resume
    from; the resumed run continues as if never stopped. A validation of the fit in progress
    is abandoned at its next batch, its metrics unlogged (a validation can take minutes, more
    than a scheduler waits): the state saved is the one it began from, and the resumed run
    redoes it at that step before training goes on, so that its metrics, the best checkpoint
    and early stopping are the uninterrupted run's. A signal at a step that a validation
    follows stops the run at that validation's first batch, the same way: saved at the step's
    end, the resumed run would skip that validation (Lightning counts it as done). The fit's
    last validation, after which no step is left, runs to its end before the stop
    (`fit_ends_after`).

    Several processes agree on the step: after each optimizer step and before each
    validation batch they take the largest signal number any rank received (one scalar
    all-reduce), so a signal that reaches one rank, or the ranks at different steps, stops
    them all at the same step, and all take part in the collective save."""

    def __init__(self):
        self.stops: Stops | None = None  # the run's, from the fit's start to its end
        self.seen_step = -1
        self.validation_began: dict | None = None  # the fit's validation loop's progress
        self.save_waits = False  # in a stop's checkpoint: ModelCheckpoint's save awaits its end

    def state_dict(self) -> dict:
        return {"save_waits": self.save_waits}

    def load_state_dict(self, state_dict: dict) -> None:
        self.save_waits = state_dict["save_waits"]

    def on_train_start(self, trainer, pl_module):
        """A validation abandoned when ModelCheckpoint had put off its save at that step to the
        validation's end: the redone validation saves (as the run never stopped did)."""
        if self.save_waits and trainer.checkpoint_callback is not None:
            defer_save(trainer.checkpoint_callback)
        self.save_waits, self.seen_step = False, trainer.global_step
        self.stops = active_stops()
        if self.stops is not None:
            self.stops.defer()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stepped, self.seen_step = trainer.global_step != self.seen_step, trainer.global_step
        # not while accumulating (the step is not done yet), nor before a validation, nor at
        # the step the fit's time runs out at (it ends after it, validating)
        if stepped and not validates_after_step(trainer) and not out_of_time(trainer):
            self._stop_if_signalled(trainer, step_end=(outputs, batch, batch_idx))

    def on_validation_start(self, trainer, pl_module):
        if self.stops is not None:
            self.validation_began = validation_progress(trainer).state_dict()

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if self.validation_began is not None and not fit_ends_after(trainer):
            self._stop_if_signalled(trainer, self.validation_began)

    def on_validation_end(self, trainer, pl_module):
        """A signal during the last batch: the validation is whole, and the run stops after the
        next step. Stopping here would skip what follows it (the checkpoint callbacks run last,
        and at an epoch's end they and early stopping take the validation at the epoch's end),
        and the resumed run would not validate that step again."""
        self.validation_began = None

    def _stop_if_signalled(
        self,
        trainer,
        validation_began: dict | None = None,
        step_end: tuple | None = None,
        at_end: bool = False,
    ) -> None:
        """Saves the step and raises Interrupted if a rank received a signal. A validation in
        progress (`validation_began`: its loop's progress as it began) is abandoned, saved as
        begun at its first batch: Lightning resumes a validation saved half-way at the batch
        it stopped in, and would log the batches left as the whole; one at its first batch it
        runs whole. `last.ckpt` is recorded as ModelCheckpoint's last checkpoint, which the
        resumed run then overwrites (else it versions its own, `last-v1.ckpt`). A stop after a
        step (`step_end`: its hook's arguments) logs the step's training row first, as Lightning
        would after the hook. At the fit's end (`at_end`), `last.ckpt` is ModelCheckpoint's own
        save of the end (kept if it saved at that step), the one the run never stopped writes."""
        if self.stops is None:
            return
        signum = self.stops.received
        if trainer.world_size > 1:
            mine = torch.tensor(signum, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(mine, reduce_op="max"))
        if not signum:
            return
        self.stops.received = signum  # a rank that received none stops on another's
        if step_end is not None:
            log_step_row(trainer, *step_end)
        if validation_began is not None:
            progress = validation_progress(trainer)
            progress.load_state_dict(validation_began)
            progress.increment_ready()
            progress.increment_started()
        ckpt = trainer.checkpoint_callback
        if ckpt is None or ckpt.dirpath is None:
            raise self.stops.stop(f"at step {trainer.global_step}: nothing saved")
        path = Path(ckpt.dirpath) / f"{ckpt.CHECKPOINT_NAME_LAST}{ckpt.FILE_EXTENSION}"
        ckpt.last_model_path = str(path)  # before the save: the callback's state holds it
        waits = save_deferred(ckpt) or saved_at_step(ckpt, trainer)
        self.save_waits = validation_began is not None and waits
        if at_end and ckpt.save_last:
            save_last(ckpt, trainer)
        else:
            trainer.save_checkpoint(path, weights_only=False)  # the full state a resume needs
        raise self.stops.stop(
            f"at step {trainer.global_step}: {path} written; "
            f"the same command with ckpt_path={path} continues the run"
        )

    def on_train_end(self, trainer, pl_module):
        """A signal after the last step's check or in the fit's last validation, saved here
        as ModelCheckpoint saves the fit's end; the Trainer's handlers back for its teardown,
        the signals still deferred while ModelCheckpoint writes the last step."""
        self._stop_if_signalled(trainer, at_end=True)
        if self.stops is not None:
            self.stops.replaced_back()

    def on_fit_end(self, trainer, pl_module):
        """What follows the fit (testing, baselines, export) stops at once again, its line
        naming the resume that runs it from its start (the fit, done, does nothing: resume.py
        `already_done`). The run's `Stops` even when the fit trained no step (a resume of a
        fit that ended), whose line would say that training had not begun."""
        self.stops, stops = None, active_stops()
        if stops is not None:
            ckpt = trainer.checkpoint_callback
            last = ckpt.last_model_path if ckpt is not None else None
            again = f"; the same command with ckpt_path={last} runs it" if last else ""
            stops.resume(
                f"after training ended at step {trainer.global_step}, its checkpoints written: "
                f"what follows the fit did not run{again}"
            )

    def on_exception(self, trainer, pl_module, exception):
        """The signals stay deferred: one while the run unwinds would hide its error."""
        if self.stops is not None:
            self.stops.replaced_back()
        self.stops, self.validation_began = None, None
        shut_down_workers(trainer)


def out_of_time(trainer) -> bool:
    """Whether `trainer.max_time` is spent at this step: Lightning's Timer, whose hook runs
    after this one's, then stops the fit, validating at this step first (a stop here would
    lose that validation: the resumed fit, out of time, does nothing). Rank 0's clock, as the
    Timer's."""
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    if not timers:
        return False
    spent = any(t.time_remaining() is not None and t.time_remaining() <= 0 for t in timers)
    return bool(trainer.strategy.broadcast(spent))


def fit_ends_after(trainer) -> bool:
    """Whether the fit ends after this validation (its last step is done, its last epoch's last
    batch, or the fit was told to stop: `trainer.max_time` reached): a stop there lets it
    finish, and saves at the fit's end. Abandoned, its resumed run would not redo it:
    Lightning skips a fit whose `max_steps`, `max_epochs` or time is reached, and the
    validation's figures, best checkpoint and early-stopping check with it."""
    if trainer.should_stop or 0 <= trainer.max_steps <= trainer.global_step:
        return True
    epochs = trainer.max_epochs
    return (
        epochs is not None
        and epochs >= 0
        and trainer.current_epoch + 1 >= epochs
        and (trainer.is_last_batch)
    )


def shut_down_workers(trainer) -> None:
    """The workers of the run's loaders, ended now. They ignore the stop signals (the main
    process saves first); a persistent validation loader's stay alive with the exception's
    frames, and at exit multiprocessing would end them with SIGTERM and wait for them forever."""
    for loaders in (trainer.train_dataloader, trainer.val_dataloaders):
        for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
            end_workers(loader)
