"""Config keys renamed in this release, each still read under its old name until the next one:
given on the command line or in a user's config, with a one-line warning naming the new key
(`config.py`); in the records of checkpoints written before, silently (`checkpoint.py`).
Standard library only, at the bottom of the layers: both sides read it."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

# old key -> (new key, the new spelling of each old value that has one)
RENAMED = {
    "data.objective": ("data.nsp", {"mlm": False, "mlm_nsp": True}),
    "distill.teacher": ("soft_labels.encoder", {}),
    "distill.weight": ("soft_labels.weight", {}),
}


def renamed(key: str, value: Any) -> tuple[str, Any]:
    """The new key and value of deprecated `key` set to `value`."""
    new, values = RENAMED[key]
    return new, values.get(value, value) if isinstance(value, str) else value


def warn_renamed(key: str) -> None:
    log.warning("%s is deprecated (removed in the next release); use %s", key, RENAMED[key][0])


def current_record(record: dict, prefix: str = "") -> dict:
    """A checkpoint's record of config keys (each `prefix` + its key: `data.` for a module's
    `data` settings) under this release's keys and values."""
    out = {}
    for key, value in record.items():
        if prefix + key in RENAMED:
            new, value = renamed(prefix + key, value)
            key = new.removeprefix(prefix)
        out[key] = value
    return out
