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
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.plugins.io import TorchCheckpointIO
from omegaconf import DictConfig, OmegaConf

from bert_lightning.atomic import atomic_path
from bert_lightning.checkpoint import ResumePoint
from bert_lightning.data.sampling import hash_seed
from bert_lightning.errors import UserError

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
    if start and (saved.get("head_lr") is None) != (optim.get("head_lr") is None):
        raise UserError(
            f"optim.head_lr={optim.get('head_lr')}, but the run it continues had "
            f"{saved.get('head_lr')}: a resumed run keeps its optimizer's parameter groups "
            "(a rate may change, not whether the heads have one of their own)"
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


def keep_metrics_before(metrics_csv: Path, step: int) -> None:
    """Drops the rows of `metrics.csv` at `step` or later: a run continued from a checkpoint at
    `step` logs them again (a crashed run may have logged past its last checkpoint), so that the
    file holds every step once, in order. `step` 0 (a fresh run) empties it."""
    if not metrics_csv.is_file():
        return
    with open(metrics_csv, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [r for r in rows if r.get("step") and int(r["step"]) < step]
    if not kept:
        metrics_csv.unlink()
        return
    with atomic_path(metrics_csv) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)


def remove_hydra_only_folder(folder: Path) -> None:
    """Removes a run folder that holds only what Hydra wrote before the run started (`.hydra/`
    and the job's log): a run that did nothing leaves no folder behind."""
    if folder.is_dir() and all(
        p.name == ".hydra" or (p.suffix == ".log" and p.is_file()) for p in folder.iterdir()
    ):
        shutil.rmtree(folder)
