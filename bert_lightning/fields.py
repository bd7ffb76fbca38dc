"""Config sections -> checked values: a misspelt key (`+data.masking.mlm_probabilty=0.2`) is an
error naming the key and the known ones, never a silent fall back to a default; a value of the
wrong type (`data.batch_size=abc`) one naming the key and the type expected; in a dataclass
section, a value outside its field's `Literal` (`task.pooling=last4`) one naming the values
allowed. Standard library only, at the bottom of the layers: the checks of a Hydra section
(`_target_`'s annotations, `???` values) are `training/instantiate.py`'s."""

from __future__ import annotations

import json
from dataclasses import MISSING, fields
from pathlib import Path
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

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
    missing = [
        f.name
        for f in fields(cls)
        if f.name not in raw and f.default is MISSING and f.default_factory is MISSING
    ]
    if missing:
        raise UserError(f"{where}: missing key(s) {missing}")
    hints = get_type_hints(cls)
    check_choices(raw, hints, where)
    check_values(raw, hints, where)
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


def choices(annotation) -> tuple | None:
    """The values a `Literal[...]` annotation allows (and None, for `Literal[...] | None`);
    None for any other annotation, a union with another type (`bool | Literal["link"]`) too."""
    members = get_args(annotation) if get_origin(annotation) in (Union, UnionType) else ()
    members = [m for m in members or (annotation,) if m is not type(None)]
    if not members or not all(get_origin(m) is Literal for m in members):
        return None
    allowed = tuple(v for m in members for v in get_args(m))
    return allowed + (None,) if type(None) in get_args(annotation) else allowed


def check_choices(values: dict, hints: dict, where: str) -> None:
    """Each value of a key annotated `Literal[...]` in `hints` against the values it allows."""
    for key, value in values.items():
        allowed = choices(hints.get(key))
        if allowed is not None and value not in allowed:
            raise UserError(f"{where}.{key}={value!r}; expected one of {allowed}")


def check_values(values: dict, hints: dict, where: str) -> None:
    """Each value against its key's annotation in `hints` (keys without one pass)."""
    for key, value in values.items():
        problem = type_error(hints[key], value) if key in hints else None
        if problem:
            raise UserError(f"{where}.{key}: {problem}")


def read_json(path: str | Path, expected: type = dict):
    """The JSON value of a file, of type `expected` (an object: a dict; an array: a list), or
    one line naming the file."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(raw, expected):
        raise UserError(f"{path}: holds a JSON {type(raw).__name__}; expected {expected.__name__}")
    return raw


def json_file(path: str | Path, hints: dict) -> dict:
    """A JSON object read from a file someone else may have made (a model folder's
    config.json, tokenizer_config.json, onnx.json): the values of the keys in `hints` checked
    against their annotations, so a value of another type is one line naming the file and the
    key, not a traceback where it is used; other keys pass as read."""
    raw = read_json(path)
    check_values({k: v for k, v in raw.items() if k in hints}, hints, str(path))
    return raw
