"""Checkpoints that a crash while saving cannot break, read back as data."""

from __future__ import annotations

import os

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from bert_lightning.atomic import atomic_path


class AtomicCheckpointIO(TorchCheckpointIO):
    """Local checkpoints are written to a temporary name in the same folder, synced, then
    renamed over the old file (`os.replace`, atomic on POSIX): `last.ckpt` is always either the
    old or the new checkpoint. Lightning's own writer stages the file in the system temporary
    folder and *copies* it when that is on another file system, so a crash mid-copy leaves a
    truncated file. Remote URLs keep Lightning's writer."""

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())

    def load_checkpoint(self, path, map_location=lambda storage, loc: storage, weights_only=None):
        """Weights-only whatever the caller asks (Lightning leaves it to torch's default): a
        checkpoint a run resumes may be someone else's (checkpoint.py reads its records)."""
        return super().load_checkpoint(path, map_location, weights_only=True)
