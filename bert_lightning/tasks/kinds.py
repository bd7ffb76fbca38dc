"""The task kinds by name (`task.kind`); `make_task`, which reads a task config into its kind's
dataclass before building it (`stored_task` for one a checkpoint or export stores); and
`hf_head`, what `export-hf` asks of a checkpoint's task."""

from __future__ import annotations

import logging
from dataclasses import fields

from bert_lightning.errors import UserError
from bert_lightning.fields import from_dict
from bert_lightning.shipped import group_defaults
from bert_lightning.tasks.ad_relevance import AdRelevance, pairwise_loss
from bert_lightning.tasks.base import Task, load_splits, subset
from bert_lightning.tasks.classification import SeqClassification, TokenClassification
from bert_lightning.tasks.regression import Regression

__all__ = [
    "TASKS",
    "Task",
    "hf_head",
    "load_splits",
    "make_task",
    "pairwise_loss",
    "stored_task",
    "subset",
]
log = logging.getLogger(__name__)

TASKS = {
    "seq_classification": SeqClassification,
    "regression": Regression,
    "ad_relevance": AdRelevance,
    "token_classification": TokenClassification,
}


def task_class(kind) -> type[Task]:
    if kind not in TASKS:
        raise UserError(f"task.kind={kind!r}; expected one of {sorted(TASKS)}")
    return TASKS[kind]


def make_task(cfg: dict) -> Task:
    """The task of a config dict (`conf/task/<kind>.yaml` as composed, or the one a checkpoint
    stores): a misspelt or missing key, or a bad value, is a one-line error here, before any
    file is read."""
    cls = task_class(cfg.get("kind"))
    return cls(from_dict(cls.config_class, cfg, "task"))


def stored_task(cfg: dict, where: str) -> Task:
    """The task a checkpoint or export (`where`) stores: a key it lacks, written before the key
    existed, takes its shipped value (`conf/task/<kind>.yaml`), which keeps what the model did
    then (a new option's shipped value is the old behaviour)."""
    cls = task_class(cfg.get("kind"))
    lacking = [f.name for f in fields(cls.config_class) if f.name not in cfg]
    shipped = group_defaults("task", cfg["kind"]) if lacking else {}  # read only when needed
    missing = {k: shipped[k] for k in lacking if k in shipped}
    if missing:
        log.info("%s: task keys from before %s, their shipped values taken", where, sorted(missing))
    return make_task(cfg | missing)


def hf_head(task: dict) -> tuple[str, str | None]:
    """transformers' class and `problem_type` of a fine-tuned checkpoint's head, from the task
    config it stores; a UserError where transformers has no class for it."""
    return task_class(task.get("kind")).hf_head(task)
