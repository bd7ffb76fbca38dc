"""A run stopped by a signal: Ctrl-C, a scheduler's SIGTERM or SLURM's SIGUSR1 save the step
in progress and end the run with one line, and the loaders' workers end with it."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import lightning as L
import torch

from bert_lightning.errors import UserError
from bert_lightning.signals import STOP_SIGNALS


class Interrupted(UserError):
    """A run stopped by a signal (Ctrl-C, a scheduler's SIGTERM or SLURM's SIGUSR1), its last
    step saved. It exits with 128 + the signal's number, as a shell reports a process the
    signal ended: a batch script tells a run to requeue from a failed one."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class SaveOnInterrupt(L.Callback):
    """SIGINT (Ctrl-C), SIGTERM (most schedulers' preemption notice) or SIGUSR1 (SLURM's
    `--signal=USR1@<seconds>`) ends the run once the optimizer step in progress is done:
    `last.ckpt` is written at that step (atomically) and the run stops with one line naming the
    step and the checkpoint to resume from; the resumed run continues as if never stopped. A
    signal during a validation of the fit (the last of a time budget's too) stops the run when
    that validation ends (it is bounded: `data.max_eval_samples`).

    Several processes agree on the step: after each optimizer step they take the largest
    signal number any rank received (one scalar all-reduce, beside the one Lightning makes
    at each step), so a signal that reaches one rank, or the ranks at different steps, stops
    them all at the same step, and all take part in the collective save."""

    def __init__(self):
        self.received = 0  # the signal's number, 0 while none came
        self.previous: dict = {}
        self.seen_step = -1

    def on_train_start(self, trainer, pl_module):
        self.seen_step = trainer.global_step
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:  # Lightning's own (SLURM's requeue) are put back at the end
            self.previous[sig] = signal.signal(sig, self._receive)

    def _receive(self, signum, frame) -> None:
        self.received = signum

    def _restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        stepped, self.seen_step = trainer.global_step != self.seen_step, trainer.global_step
        if stepped:  # not while accumulating: the step is not done yet
            self._stop_if_signalled(trainer)

    def on_validation_end(self, trainer, pl_module):
        """A signal during a validation of the fit (the last one of a budget included) stops the
        run as it ends, at the step it validated."""
        if trainer.state.fn == "fit" and not trainer.sanity_checking:
            self._stop_if_signalled(trainer)

    def _stop_if_signalled(self, trainer) -> None:
        signum = self.received
        if trainer.world_size > 1:
            mine = torch.tensor(signum, device=trainer.strategy.root_device)
            signum = int(trainer.strategy.reduce(mine, reduce_op="max"))
        if not signum:
            return
        self._restore()
        name = signal.Signals(signum).name
        ckpt = trainer.checkpoint_callback
        if ckpt is None or ckpt.dirpath is None:
            raise Interrupted(f"{name} at step {trainer.global_step}: nothing saved", signum)
        path = Path(ckpt.dirpath) / f"{ckpt.CHECKPOINT_NAME_LAST}{ckpt.FILE_EXTENSION}"
        trainer.save_checkpoint(path, weights_only=False)  # the full state a resume needs
        raise Interrupted(
            f"{name} at step {trainer.global_step}: {path} written; "
            f"the same command with ckpt_path={path} continues the run",
            signum,
        )

    def on_train_end(self, trainer, pl_module):
        self._restore()

    def on_exception(self, trainer, pl_module, exception):
        self._restore()
        shut_down_workers(trainer)


def shut_down_workers(trainer) -> None:
    """The workers of the run's loaders, ended now. They ignore the stop signals (the main
    process saves first); a persistent validation loader's stay alive with the exception's
    frames, and at exit multiprocessing would end them with SIGTERM and wait for them forever."""
    for loaders in (trainer.train_dataloader, trainer.val_dataloaders):
        for loader in loaders if isinstance(loaders, list | tuple) else [loaders]:
            workers = getattr(loader, "_iterator", None)
            if workers is not None and hasattr(workers, "_shutdown_workers"):
                workers._shutdown_workers()
