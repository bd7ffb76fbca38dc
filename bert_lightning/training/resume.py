"""What makes a resumed run the same run: per-step random seeds, and checkpoints that a crash
while saving cannot break."""

from __future__ import annotations

import os

import lightning as L
import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from bert_lightning.atomic import atomic_path
from bert_lightning.data.sampling import hash_seed


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
