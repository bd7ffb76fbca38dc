"""The task kinds by name (`task.kind`), and `make_task`, which checks a task config's keys
against its kind before building it."""

from __future__ import annotations

from bert_lightning.errors import UserError
from bert_lightning.fields import check_keys
from bert_lightning.tasks.ad_relevance import AdRelevance, pairwise_loss
from bert_lightning.tasks.base import Task, load_splits, subset
from bert_lightning.tasks.classification import SeqClassification, TokenClassification
from bert_lightning.tasks.regression import Regression

__all__ = ["TASKS", "Task", "load_splits", "make_task", "pairwise_loss", "subset"]

TASKS = {
    "seq_classification": SeqClassification,
    "regression": Regression,
    "ad_relevance": AdRelevance,
    "token_classification": TokenClassification,
}


def make_task(cfg: dict) -> Task:
    if cfg.get("kind") not in TASKS:
        raise UserError(f"task.kind={cfg.get('kind')!r}; expected one of {sorted(TASKS)}")
    cls = TASKS[cfg["kind"]]
    check_keys(cfg, cls.keys, f"task (kind={cfg['kind']})")
    return cls(cfg)
