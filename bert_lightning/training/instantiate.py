"""Hydra config sections -> checked objects: a section's values checked against its
`_target_`'s annotations and a `???` value named before anything runs, each as one line naming
the key. Apart from `fields.py`'s checks, which stay standard library at the bottom of the
layers: these need Hydra and OmegaConf."""

from __future__ import annotations

from typing import get_type_hints

from hydra.utils import get_object
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, OmegaConf

from bert_lightning.errors import UserError
from bert_lightning.fields import check_values


def instantiate(node, where: str, **kwargs):
    """Hydra's `instantiate` of the config section `where` (data, model, trainer, ...), after
    checking its values against the annotations of its `_target_`'s parameters: a value of the
    wrong type (`data.batch_size=abc`) is an error naming the key, not a traceback from deep
    inside the code that first uses it."""
    check_types(node, where)
    return hydra_instantiate(node, **kwargs)


def check_types(node, where: str) -> None:
    """`instantiate`'s check alone: the values of a section built later (optim)."""
    target = get_object(node["_target_"])
    # a subclass's `**kwargs` reach its bases: their annotations count too
    fns = [c.__init__ for c in reversed(target.__mro__)] if isinstance(target, type) else [target]
    hints = {}
    for fn in fns:
        try:
            hints |= get_type_hints(fn)
        except Exception:  # annotations this Python cannot evaluate: nothing to check
            continue
    check_values({k: v for k, v in node.items() if not str(k).startswith("_")}, hints, where)


def missing_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The keys still `???`, found without resolving anything (OmegaConf's own
    `missing_keys` resolves, and fails on an interpolation of a missing value)."""
    found = []
    for key in node:
        if OmegaConf.is_missing(node, key):
            found.append(f"{prefix}{key}")
        elif isinstance(child := node._get_node(key), DictConfig):
            found += missing_keys(child, f"{prefix}{key}.")
    return found


def required(cfg: DictConfig) -> None:
    """A value still `???` (a data option's train_files, a data set's data_dir, a task's
    train_file) is named in one line before anything runs."""
    missing = missing_keys(cfg)
    if missing:
        raise UserError(
            f"{', '.join(missing)}: required and not given; add "
            + " ".join(f"{k}=..." for k in missing)
            + " to the command"
        )
