"""The one way the package keys a cache or a memo: by everything its contents depend on, so that
a changed input is a miss, never a stale hit. A file is named by its absolute path, size and
modification time (`file_stamps`) or, where it may be copied or touched and still be the same
(a checkpoint), by its contents (`file_digest`)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable


def fingerprint(*parts) -> str:
    """A key for `parts` (plain values, tuples, lists, dicts, dataclasses: anything whose `repr`
    shows all it holds): equal parts, equal keys."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def file_stamps(files: Iterable[str | os.PathLike]) -> list[tuple[str, int, int]]:
    """Each file's absolute path, size and modification time (ns): an edited, replaced or
    moved file gives another stamp."""
    stamps = []
    for f in files:
        st = os.stat(f)
        stamps.append((os.path.abspath(f), st.st_size, st.st_mtime_ns))
    return stamps


def file_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes; of a folder (a Hugging Face model: weights, config,
    tokenizer), of its files' names and digests. A copy has the same digest, the same path
    written again another."""
    if os.path.isdir(path):
        files = sorted((f for f in os.scandir(path) if f.is_file()), key=lambda f: f.name)
        return fingerprint([(f.name, file_digest(f.path)) for f in files])
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
