"""What makes a resumed run the same run: per-step random seeds, checkpoints that a crash while
saving cannot break, and `ckpt_path=` continuing the run it names: in its own folder (Hydra's
run folder for a resume is the checkpoint's, see `conf/train.yaml`), on its own learning-rate
schedule, with its metrics appended to its `metrics.csv`."""

from __future__ import annotations

import csv
import logging
import os
import re
import shutil
import signal
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from bert_lightning.atomic import atomic_path, write_text
from bert_lightning.checkpoint import RTD_KEY, ResumePoint
from bert_lightning.data.sampling import hash_seed
from bert_lightning.errors import UserError, first_line, user_error
from bert_lightning.signals import STOP_SIGNALS

log = logging.getLogger(__name__)


class StepSeed(L.Callback):
    """Reseeds torch (CPU and every GPU) before each training batch from (seed, rank, epoch,
    batch): dropout then depends on the step only, not on what the process did before, so a
    run resumed from a checkpoint draws what the uninterrupted run drew (Lightning saves no
    random state), and ranks draw differently from one another."""

    def __init__(self, seed: int):
        self.seed = seed

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        torch.manual_seed(
            hash_seed(self.seed, trainer.global_rank, trainer.current_epoch, batch_idx)
        )


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
        trainer.save_checkpoint(path)
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


class AtomicCheckpointIO(TorchCheckpointIO):
    """Local checkpoints are written to a temporary name in the same folder, synced, then
    renamed over the old file (`os.replace`, atomic on POSIX): `last.ckpt` is always either the
    old or the new checkpoint. Lightning's own writer stages the file in the system temporary
    folder and *copies* it when that is on another file system, so a crash mid-copy leaves a
    truncated file. Remote URLs keep Lightning's writer."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())


def run_folder_of(ckpt_path: str | os.PathLike) -> Path | None:
    """The run folder a checkpoint of ours sits in (`<run>/checkpoints/last.ckpt`), else None
    (a checkpoint copied elsewhere, or a path that is not a file: a new folder then)."""
    path = Path(ckpt_path)
    return path.parent.parent if path.is_file() and path.parent.name == "checkpoints" else None


def already_done(cfg: DictConfig, start: ResumePoint | None) -> bool:
    """True when the checkpoint a run resumes already reached `trainer.max_steps`: says so in
    one line and writes nothing (the folder Hydra made for the run, if new, is removed)."""
    max_steps = cfg.trainer.max_steps
    if start is None or max_steps is None or max_steps < 0 or start.step < max_steps:
        return False
    print(
        f"{cfg.ckpt_path} already reached max_steps={max_steps}: nothing to do "
        "(raise trainer.max_steps to continue)"
    )
    out_dir = Path(cfg.paths.output_dir)
    if hydra_run_dir() == out_dir:
        remove_hydra_only_folder(out_dir)
    return True


def hydra_run_dir() -> Path | None:
    """The folder Hydra made for this job; None outside a Hydra job (tests, notebooks)."""
    if not HydraConfig.initialized():
        return None
    folder = OmegaConf.select(HydraConfig.get(), "runtime.output_dir", throw_on_missing=False)
    return Path(folder) if folder else None


# model settings a continued run may change: they shape no weight and no computation to come
FREE_ON_RESUME = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")
TASK_MODEL_KEYS = ("kind", "architecture", "pooling", "labels")  # the task's part of the model


def objective_name(hparams) -> str:
    """What a run's module hyper-parameters (or its `objective` config) train: objects that
    other modules build, so a resumed run keeps it."""
    if hparams.get("teacher"):
        return f"objective=distill from teacher {hparams['teacher']}"
    if hparams.get(RTD_KEY) is not None:
        return f"objective=rtd with generator_hidden_size={hparams[RTD_KEY]}"
    return "objective=mlm"


def check_same_objective(start: ResumePoint | None, ckpt_path: str, objective) -> None:
    """A continued pretraining run keeps its objective (MLM, RTD with its generator's width,
    distillation from its teacher): another one builds other modules."""
    if start is None or objective_name(start.hparams) == objective_name(objective):
        return
    raise UserError(
        f"{ckpt_path}: trained with {objective_name(start.hparams)}, this run asks for "
        f"{objective_name(objective)}; a resumed run keeps its objective"
    )


def check_same_model(
    start: ResumePoint | None, ckpt_path: str, model: dict, task: dict | None = None
) -> None:
    """A continued run trains the checkpoint's model: a `model` (or, fine-tuning, `task`)
    config that builds another one is an error naming the settings that differ, not a
    `state_dict` size mismatch."""
    if start is None:
        return
    sections = [("model", start.hparams.get("config") or {}, model, list(model))]
    if task is not None:
        sections.append(("task", start.hparams.get("task") or {}, task, TASK_MODEL_KEYS))
    differ = [
        (f"{name}.{k}", saved[k], now.get(k))
        for name, saved, now, keys in sections
        for k in keys
        if k not in FREE_ON_RESUME and k in saved and saved[k] != now.get(k)
    ]
    if differ:
        was = ", ".join(f"{k}={a}" for k, a, _ in differ)
        now = ", ".join(f"{b}" for _, _, b in differ)
        raise UserError(
            f"{ckpt_path}: its model has {was}, this run's has {now}; "
            "a resumed run keeps its model (give the run's settings)"
        )


def continued_optim(optim: dict, start: ResumePoint | None, max_steps: int) -> dict:
    """The `conf/optim` config of a continued run: the schedule's `total_steps` is the original
    run's (its checkpoint records it), so the learning rate goes on decaying where it was,
    unless `optim.total_steps` is set. Past that total the learning rate stays 0: a warning says
    so and how to stretch the decay."""
    saved = (start.hparams.get("optim") or {}) if start else {}
    for key, one, whose in (("head_lr", None, "the heads"), ("layer_decay", 1.0, "the layers")):
        was, now = saved.get(key, one), optim.get(key, one)
        if start and (was == one) != (now == one):
            raise UserError(
                f"optim.{key}={now}, but the run it continues had {was}: a resumed run keeps "
                f"its optimizer's parameter groups (a rate may change, not whether {whose} "
                "have rates of their own)"
            )
    if start is None or optim.get("total_steps") is not None:
        return optim
    total = saved.get("total_steps")
    if total is None:  # a checkpoint older than the record: the schedule spans this fit
        return optim
    if max_steps is not None and max_steps > total:
        log.warning(
            "the learning rate schedule of the continued run ends at step %d (its "
            "optim.total_steps): later steps train at lr 0; optim.total_steps=%d stretches "
            "the decay to trainer.max_steps",
            total,
            max_steps,
        )
    return {**optim, "total_steps": total}


@contextmanager
def own_checkpoints_expected(ckpt_path: str | None) -> Iterator[None]:
    """A run continued in its own folder finds its checkpoints there: Lightning's warning
    about a non-empty checkpoint folder is then expected, and silenced for that folder only."""
    with warnings.catch_warnings():
        if ckpt_path:
            folder = re.escape(str(Path(ckpt_path).resolve().parent))
            warnings.filterwarnings(
                "ignore", message=f"Checkpoint directory {folder} exists and is not empty"
            )
        yield


def follow_moved_run(checkpoint: dict, dirpath: str, ckpt_path: str) -> None:
    """A run folder moved or copied since its checkpoint was written (the checkpoint resumed
    sits in the folder the run now writes to, `dirpath`): the checkpoint callback's state
    names the old folder, and Lightning would keep none of it (`last-v1.ckpt` written beside
    `last.ckpt`, the best forgotten). Its paths become those of the folder the run continues
    in. A run continued into another folder keeps them (the old folder still holds its best)."""
    if Path(ckpt_path).resolve().parent != Path(dirpath).resolve():
        return
    for key, state in (checkpoint.get("callbacks") or {}).items():
        old = state.get("dirpath") if isinstance(state, dict) else None
        if not key.startswith("ModelCheckpoint") or not old or old == dirpath:
            continue

        def moved(path, old=old):
            return (
                dirpath + path[len(old) :]
                if isinstance(path, str) and path.startswith(old)
                else path
            )

        for k in ("best_model_path", "kth_best_model_path", "last_model_path"):
            state[k] = moved(state.get(k))
        state["best_k_models"] = {moved(p): v for p, v in state.get("best_k_models", {}).items()}
        state["dirpath"] = dirpath
        log.info(
            "the run moved from %s: it continues in %s", Path(old).parent, Path(dirpath).parent
        )


def keep_metrics_through(metrics_csv: Path, step: int | None) -> None:
    """Drops the rows of `metrics.csv` after `step`: a run continued from a checkpoint at
    `step` logs them again (a crashed run may have logged past its last checkpoint), so that the
    file holds every step once, in order. `None` (a fresh run) empties it."""
    if not metrics_csv.is_file():
        return
    with open(metrics_csv, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [r for r in rows if step is not None and r.get("step") and int(r["step"]) <= step]
    if not kept:
        metrics_csv.unlink()
        return
    with atomic_path(metrics_csv) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)


FAILED = "FAILED"  # the marker file of a run folder whose run raised: its one-line reason


class RunState:
    """`begun`: the run has started writing its own results (set just before the fit)."""

    begun = False


@contextmanager
def failure_marked(out_dir: Path, resuming: bool) -> Iterator[RunState]:
    """A run that raises leaves `FAILED` (its one-line reason) beside its log; one that
    completes removes the marker of the crashed run it continued. A user's mistake found
    before the run begins writes nothing: a refused resume leaves the run it names as it was,
    and a folder Hydra made for this job, holding only Hydra's files, is removed."""
    state, out_dir = RunState(), Path(out_dir)
    try:
        yield state
    except BaseException as e:
        if rank_zero_only.rank == 0:
            refused = not state.begun and user_error(e) is not None
            if refused and hydra_run_dir() == out_dir:
                remove_hydra_only_folder(out_dir)
            if not (refused and (resuming or not out_dir.exists())):
                with suppress(UserError):  # a folder it cannot write: the error says why
                    write_text(out_dir / FAILED, f"{type(e).__name__}: {first_line(e)}\n")
        raise
    if rank_zero_only.rank == 0:
        (out_dir / FAILED).unlink(missing_ok=True)


def remove_hydra_only_folder(folder: Path) -> None:
    """Removes a run folder that holds only what Hydra wrote before the run started (`.hydra/`
    and the job's log): a run that did nothing leaves no folder behind, nor the folders of
    the default run path (`<paths.log_dir>/<task_name>/runs/`) that it alone made."""
    if folder.is_dir() and all(
        p.name == ".hydra" or (p.suffix == ".log" and p.is_file()) for p in folder.iterdir()
    ):
        shutil.rmtree(folder)
        if folder.parent.name == "runs":
            for parent in folder.parents[:3]:
                if any(parent.iterdir()):
                    break
                parent.rmdir()
