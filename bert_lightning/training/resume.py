"""What makes a resumed run the same run: per-step random seeds, and `ckpt_path=` continuing
the run it names with its objective, its model, its data and its learning-rate schedule (where
it writes and how its folder is found again: `run_folder.py`)."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
from hydra.utils import get_object
from omegaconf import DictConfig

from bert_lightning.checkpoint import RTD_KEY, ResumePoint, objective_of
from bert_lightning.data.sampling import hash_seed
from bert_lightning.errors import UserError
from bert_lightning.run_folder import drop_unused_folder
from bert_lightning.training.instantiate import check_types, command_line

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


def already_done(
    cfg: DictConfig, resume: ResumePoint | None, finished: Callable[[DictConfig, int], bool]
) -> bool:
    """True when the checkpoint a run resumes already reached `trainer.max_steps` and what
    follows its fit ran to its end (`finished(cfg, step)`): says so in one line and writes
    nothing (the folder Hydra made for the run, if new, is removed). A run stopped after its
    fit (in fine-tuning's test) is not done: resumed, its fit does nothing, and what follows
    it runs again from its start."""
    max_steps = cfg.trainer.max_steps
    if resume is None or max_steps is None or max_steps < 0 or resume.step < max_steps:
        return False
    if not finished(cfg, resume.step):  # its fit ended: resumed, it trains nothing
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


def objective_name(name: str | None, settings) -> str:
    """The objective `name` (a checkpoint's record, or what an `objective` config's module
    trains) with the settings that other modules build from: a resumed run keeps them."""
    if name == "distill":
        return f"objective=distill from teacher {settings['teacher']}"
    if name == "rtd":
        return f"objective=rtd with generator_hidden_size={settings[RTD_KEY]}"
    return f"objective={name}"


# the hyper-parameter in which a distillation keeps its teacher's contents (`teacher`: its path)
TEACHER_DIGEST = "teacher_digest"


def check_same_objective(
    resume: ResumePoint | None, ckpt_path: str, objective: dict, teacher_digest: str | None
) -> None:
    """A continued pretraining run keeps its objective: the modules it builds (MLM, RTD,
    distillation) and every setting of them (`objective`: this run's `objective` config; loss
    weights, temperature, the generator's width), and a teacher's contents (`teacher_digest`,
    compared where the checkpoint records it): a teacher retrained at its path teaches another
    thing. Not `resume_with_new_data`'s to allow: continued, the run would be neither."""
    if resume is None:
        return
    trained = objective_name(objective_of(resume.hparams), resume.hparams)
    asked = objective_name(get_object(objective["_target_"]).OBJECTIVE, objective)
    if trained != asked:
        raise UserError(
            f"{ckpt_path}: trained with {trained}, this run asks for {asked}; a resumed run "
            "keeps its objective"
        )
    saved = resume.hparams
    differ = [
        f"objective.{k} {shown(saved[k])} -> {shown(v)}"
        for k, v in objective.items()
        if not k.startswith("_") and k in saved and saved[k] != v
    ]
    if saved.get(TEACHER_DIGEST) not in (None, teacher_digest):
        differ.append(
            f"objective.teacher: {os.path.basename(objective['teacher'])} changed (its contents)"
        )
    if differ:
        raise UserError(
            f"{ckpt_path}: trained with other objective settings: {', '.join(differ)}; a "
            "resumed run keeps its objective (give the run's settings)"
        )


def check_same_model(
    resume: ResumePoint | None, ckpt_path: str, model: dict, task: dict | None = None
) -> None:
    """A continued run trains the checkpoint's model: a `model` (or, fine-tuning, `task`)
    config that builds another one is an error naming the settings that differ, not a
    `state_dict` size mismatch."""
    if resume is None:
        return
    sections = [("model", resume.hparams.get("config") or {}, model, list(model))]
    if task is not None:
        sections.append(("task", resume.hparams.get("task") or {}, task, TASK_MODEL_KEYS))
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


def given_optim(optim: dict) -> set[str]:
    """The `optim` keys a user gives this run: the command line's (`optim.<key>=`; `optim=`:
    every key), and `total_steps` where set (its default, null, is derived)."""
    given = {o.lstrip("+~").partition("=")[0] for o in command_line("optim")}
    keys = set(optim) if "optim" in given else {k.split(".")[1] for k in given}
    return keys | ({"total_steps"} if optim.get("total_steps") is not None else set())


def continued_optim(optim: dict, resume: ResumePoint | None, max_steps: int) -> dict:
    """The `conf/optim` config of a continued run: the checkpoint's (its learning rate, its
    warmup, its schedule's `total_steps`), so the rate goes on where it was whatever the resume
    leaves out; a key the user gives (`given_optim`) replaces the saved value, and the log says
    so. Past the total the learning rate stays 0: a warning says so and how to stretch the
    decay."""
    if resume is None:
        return optim
    saved, given = resume.hparams.get("optim") or {}, given_optim(optim)
    for key, one, whose in (("head_lr", None, "the heads"), ("layer_decay", 1.0, "the layers")):
        was, now = saved.get(key, one), optim.get(key, one)
        if key in given and (was == one) != (now == one):
            raise UserError(
                f"optim.{key}={now}, but the run it continues had {was}: a resumed run keeps "
                f"its optimizer's parameter groups (a rate may change, not whether {whose} "
                "have rates of their own)"
            )
    for key in sorted(given & saved.keys()):
        if saved[key] != optim.get(key):
            log.info(
                "optim.%s=%s replaces the %s of the run it continues",
                *(key, shown(optim.get(key)), shown(saved[key])),
            )
    # the saved values, typed as the config's optimizer takes them; Hydra's keys (`_target_`)
    # are the config's: a record names no code
    kept = {k: v for k, v in saved.items() if k in optim and k not in given and k[0] != "_"}
    check_types(kept | {"_target_": optim["_target_"]}, f"{resume.path}: hyper_parameters.optim")
    continued = optim | kept
    total = continued.get("total_steps")  # None: a checkpoint older than the record
    if total is not None and max_steps is not None and max_steps > total:
        log.warning(
            "the learning rate schedule of the continued run ends at step %d (its "
            "optim.total_steps): later steps train at lr 0; optim.total_steps=%d stretches "
            "the decay to trainer.max_steps",
            total,
            max_steps,
        )
    return continued


def is_stamps(value) -> bool:
    """A list of files as a data record holds them: `file_stamps`' (path, size, mtime ns),
    with the contents' SHA-256 after them where the record keeps it (fine-tuning's tables)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(
            isinstance(s, list | tuple) and len(s) in (3, 4) and isinstance(s[1], int)
            for s in value
        )
    )


def file_changes(was: list, now: list) -> str | None:
    """How two records' files differ, None when they are the same files. A file is its name
    and size (and contents, where both records hold them): a copy in another folder, or one
    touched since, is the same file."""
    digests = all(len(s) == 4 for s in (*was, *now))
    name = lambda s: (os.path.basename(s[0]), s[1], *(s[3:] if digests else ()))
    gone = {k[0]: k for k in Counter(map(name, was)) - Counter(map(name, now))}
    new = {k[0]: k for k in Counter(map(name, now)) - Counter(map(name, was))}
    changes = []
    for f in [*gone, *(f for f in new if f not in gone)]:
        if f not in new:
            changes.append(f"{f} no longer read")
        elif f not in gone:
            changes.append(f"{f} read now")
        elif gone[f][1] != new[f][1]:
            changes.append(f"{f} changed ({gone[f][1]:,} -> {new[f][1]:,} bytes)")
        else:
            changes.append(f"{f} changed (its contents)")
    return ", ".join(changes) or None


def shown(value) -> str:
    """A record's value in a message: files by their names, numbers to 6 digits."""
    if is_stamps(value):
        return ",".join(os.path.basename(s[0]) for s in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    return "null" if value is None else str(value)


def data_changes(was: dict, now: dict, prefix: str = "") -> list[str]:
    """The parts of two data records that differ, named by config key (a nested part by its
    dotted key), each with both values; a part the older record lacks is not compared."""
    changes = []
    for key in [*now, *(k for k in was if k not in now)]:
        if key not in was or was[key] == now.get(key):
            continue
        a, b, name = was[key], now.get(key), f"{prefix}{key}"
        if is_stamps(a) and is_stamps(b):
            if (files := file_changes(a, b)) is not None:
                changes.append(f"{name}: {files}")
        elif isinstance(a, dict) and isinstance(b, dict):
            changes += data_changes(a, b, f"{name}.")
        else:
            changes.append(f"{name} {shown(a)} -> {shown(b)}")
    return changes


# what selects among a fine-tuning run's validations, never changed by a resume
MONITOR = ("task.monitor ", "task.mode ")


def check_same_data(resume: ResumePoint | None, ckpt_path: str, record: dict, new_data: bool):
    """A continued run trains on the data it trained on (`record`: this run's data record,
    compared with the checkpoint's): other data are an error naming what changed, unless
    `resume_with_new_data=true` (`new_data`), which continues on them and logs what changed;
    another monitor (`MONITOR`) is refused either way.
    A checkpoint written before the record was kept cannot be checked: a warning says so."""
    if resume is None:
        return
    if resume.data is None:
        log.warning(
            "%s records no data (written before checkpoints did): this run's data are not "
            "checked against those it trained on",
            ckpt_path,
        )
        return
    found = data_changes(resume.data, record)
    monitor = [c for c in found if c.startswith(MONITOR)]
    if monitor:
        raise UserError(
            f"{ckpt_path}: its run validated by another metric: {'; '.join(monitor)}; the best "
            "checkpoint and early stopping compare every validation of a run by one metric: "
            "start a new run from it (init_from=) to select by another"
        )
    changes = "; ".join(found)
    if not changes:
        return
    if not new_data:
        raise UserError(
            f"{ckpt_path}: trained on other data: {changes}; resume_with_new_data=true "
            "continues on these"
        )
    log.warning("%s: continuing on other data (resume_with_new_data=true): %s", ckpt_path, changes)
