"""Config sections -> checked values: a misspelt key (`+data.masking.mlm_probabilty=0.2`) is an
error naming the key and the known ones, never a silent fall back to a default."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

from bert_lightning.errors import UserError

T = TypeVar("T")


def check_keys(raw: dict, known, where: str) -> None:
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise UserError(f"{where}: unknown key(s) {unknown}; known keys: {sorted(known)}")


def from_dict(cls: type[T], raw: dict[str, Any] | None, where: str) -> T:
    """`cls(**raw)` for a dataclass, after `check_keys` against its fields."""
    raw = dict(raw or {})
    check_keys(raw, [f.name for f in fields(cls)], where)
    return cls(**raw)
