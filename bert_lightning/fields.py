"""Config sections -> checked values: a misspelt key (`+data.masking.mlm_probabilty=0.2`) is an
error naming the key and the known ones, never a silent fall back to a default; a value of the
wrong type (`data.batch_size=abc`) one naming the key and the type expected."""

from __future__ import annotations

from dataclasses import fields
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from hydra.utils import get_object
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, OmegaConf

from bert_lightning.errors import UserError

T = TypeVar("T")


def check_keys(raw: dict, known, where: str) -> None:
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")


def from_dict(cls: type[T], raw: dict[str, Any] | None, where: str) -> T:
    """`cls(**raw)` for a dataclass, after checking its keys and their values' types."""
    raw = dict(raw or {})
    check_keys(raw, [f.name for f in fields(cls)], where)
    check_values(raw, get_type_hints(cls), where)
    return cls(**raw)


# the values each simple annotation takes (a name or path may be a number: `task_name=2024`)
SIMPLE = {int: (int,), float: (int, float), bool: (bool,), str: (str, int, float)}


def type_error(annotation, value) -> str | None:
    """What is wrong with `value` for a parameter annotated `annotation` (int, float, bool,
    str, or a union of them and None), or None; richer annotations are not checked."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    members = members or (annotation,)
    if not all(m in SIMPLE or m is type(None) for m in members):
        return None
    for m in members:
        fits = value is None if m is type(None) else isinstance(value, SIMPLE[m])
        if fits and not (m in (int, float) and isinstance(value, bool)):  # true is no number
            return None
    names = " or ".join("null" if m is type(None) else m.__name__ for m in members)
    return f"expected {names}, got {value!r}"


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


def check_values(values: dict, hints: dict, where: str) -> None:
    """Each value against its key's annotation in `hints` (keys without one pass)."""
    for key, value in values.items():
        problem = type_error(hints[key], value) if key in hints else None
        if problem:
            raise UserError(f"{where}.{key}: {problem}")


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
