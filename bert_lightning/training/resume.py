"""What makes a resumed run the same run: per-step random seeds, and `ckpt_path=` continuing
the run it names with its objective, its model and its learning-rate schedule (where it writes
and how its folder is found again: `run_folder.py`)."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import torch
from omegaconf import DictConfig

from bert_lightning.checkpoint import RTD_KEY, ResumePoint
from bert_lightning.data.sampling import hash_seed
from bert_lightning.errors import UserError
from bert_lightning.run_folder import drop_unused_folder

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
    drop_unused_folder(Path(cfg.paths.output_dir))
    return True


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
