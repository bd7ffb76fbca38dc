"""`TaskDataModule`: a fine-tuning task's train/validation/test splits as loaders, what the
pretraining DataModules (data/pretraining.py) are to a corpus: `trainer.fit` and `trainer.test` take
it as they take those."""

from __future__ import annotations

import logging
from dataclasses import asdict
from functools import partial

import lightning as L
from tokenizers import Tokenizer
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from bert_lightning.data.sampling import KeepsTrainLoaderPosition, ResumableShuffle
from bert_lightning.data.tables import GroupBatchSampler, collate, eval_loader
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.fingerprints import file_digest, file_stamps
from bert_lightning.tasks.base import Task

log = logging.getLogger(__name__)


class TaskDataModule(KeepsTrainLoaderPosition, L.LightningDataModule):
    """A task's tables by split (`load_splits`'s, read before the model is built: the train
    file fixes the head's label set and holds the texts a tokenizer may be trained on) and the
    tokenizer they are encoded with; `setup` encodes every split once (validate, fit and test
    reuse them)."""

    def __init__(
        self,
        *,
        task: Task,
        tables: dict[str, dict],
        tokenizer: Tokenizer,
        batch_size: int,
        eval_batch_size: int,
        max_seq_length: int,
        seed: int,
    ):
        super().__init__()
        self.task, self.tables, self.tokenizer, self.seed = task, tables, tokenizer, seed
        self.batch_size, self.eval_batch_size = batch_size, eval_batch_size
        self.max_seq_length = max_seq_length
        self.features: dict[str, list[dict]] = {}

    def data_record(self) -> dict:
        """What the run's examples depend on, by config key (a resume compares it: training/
        resume.py): the task's settings with what the train file fixed (label set, target
        scale), its files (stamps and contents: tables are small, and an edit may keep a
        file's size), the length and the seed."""
        record = {f"task.{k}": v for k, v in asdict(self.task.cfg).items()}
        for key in ("task.train_file", "task.validation_file", "task.test_file"):
            if record[key] is not None:
                record[key] = [[*file_stamps([record[key]])[0], file_digest(record[key])]]
        return record | {"data.max_seq_length": self.max_seq_length, "seed": self.seed}

    @property
    def rows(self) -> dict[str, int]:
        """Rows per split, as encoded (what `results.json` counts)."""
        return {k: len(v) for k, v in self.features.items()}

    def setup(self, stage: str | None = None):
        if self.features:
            return
        self.features = {
            k: self.task.encode(t, self.tokenizer, self.max_seq_length)
            for k, t in self.tables.items()
        }
        log.info("rows: %s", self.rows)

    def collator(self) -> partial:
        return partial(collate, pad_id=special_ids(self.tokenizer)["[PAD]"])

    def train_dataloader(self) -> StatefulDataLoader:
        """Stateful: a resumed run continues at the same batch of the same shuffled epoch."""
        rows = self.features["train"]
        if self.task.grouped_batches:
            groups = GroupBatchSampler([f["group"] for f in rows], self.batch_size, self.seed)
            loader = StatefulDataLoader(rows, batch_sampler=groups, collate_fn=self.collator())
        else:
            t = self.trainer  # this rank's share under DDP, as pretraining's EpochSampler
            world, rank = (t.world_size, t.global_rank) if t else (1, 0)
            shuffle = ResumableShuffle(rows, num_replicas=world, rank=rank, seed=self.seed)
            loader = StatefulDataLoader(
                rows, batch_size=self.batch_size, sampler=shuffle, collate_fn=self.collator()
            )
        return self.resumed(loader)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        pad_id = special_ids(self.tokenizer)["[PAD]"]
        return eval_loader(self.features[split], self.eval_batch_size, pad_id)
