"""The brackets toy corpus, a data source for sanity checks of MLM (and its fine-tuning task).

A sentence is `pairs` bracket pairs, an opener `a..h` straight followed by its own closer
`A..H`, openers drawn uniformly: `[CLS] d D e E g G ...`. A closer is predictable from its left
neighbour, an opener only from its right one, so the gap between a bidirectional and a causal
model shows how much MLM draws on the right context.

A data source like C4, so in the data layer (`data=brackets` builds `BracketsDataModule`); the
report that trains and compares models on it is `experiments/brackets/report.py`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import lightning as L
import torch
from tokenizers import Tokenizer
from torchdata.stateful_dataloader import StatefulDataLoader

from bert_lightning.atomic import atomic_path
from bert_lightning.data.masking import MaskingConfig, MLMCollator
from bert_lightning.data.tables import EvalBatches
from bert_lightning.data.tokenizer import save_tokenizer, symbol_tokenizer
from bert_lightning.fields import from_dict

OPENERS = list("abcdefgh")
CLOSERS = list("ABCDEFGH")


def brackets_tokenizer() -> Tokenizer:
    return symbol_tokenizer(OPENERS + CLOSERS)


def sentences(n: int, pairs: int, generator: torch.Generator) -> torch.Tensor:
    """(n, 2 * pairs) symbol indices: opener k is index k, its closer k + 8."""
    openers = torch.randint(len(OPENERS), (n, pairs), generator=generator)  # (n, pairs)
    return torch.stack([openers, openers + len(OPENERS)], dim=2).reshape(n, 2 * pairs)


def ungrammatical(symbols: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Each sentence with one closer swapped for a wrong closer."""
    n, T = symbols.shape
    out = symbols.clone()
    rows = torch.arange(n)
    pos = 2 * torch.randint(T // 2, (n,), generator=generator) + 1  # (n,) closer positions
    shift = torch.randint(1, len(CLOSERS), (n,), generator=generator)  # never the right one
    out[rows, pos] = (out[rows, pos] - len(OPENERS) + shift) % len(CLOSERS) + len(OPENERS)
    return out


def grammar_rows(n: int, pairs: int, generator: torch.Generator) -> list[dict]:
    """The toy grammar task: half the sentences intact (label 1), half with one closer swapped
    for a wrong one (label 0), shuffled; text is the symbols separated by spaces."""
    symbols = sentences(n, pairs, generator)
    bad = torch.rand(n, generator=generator) < 0.5  # (n,)
    symbols = torch.where(bad[:, None], ungrammatical(symbols, generator), symbols)
    names = OPENERS + CLOSERS
    return [
        {"sentence": " ".join(names[i] for i in row), "label": int(not b)}
        for row, b in zip(symbols.tolist(), bad.tolist(), strict=True)
    ]


def write_grammar_data(folder: str | os.PathLike, seed: int = 0) -> Path:
    """`train/validation/test.jsonl` of the grammar task and the brackets `tokenizer.json`, for
    `finetune.py experiment=brackets_grammar`; written once (atomically) per folder and seed."""
    folder = Path(folder) / f"seed{seed}"
    if (folder / "tokenizer.json").is_file():
        return folder
    # replace=False: a folder written meanwhile by another process is kept
    with atomic_path(folder, folder=True, replace=False) as tmp:
        g = torch.Generator().manual_seed(seed)
        for split, n in (("train", 9600), ("validation", 1000), ("test", 2000)):
            lines = [json.dumps(r) for r in grammar_rows(n, 8, g)]
            (tmp / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
        save_tokenizer(brackets_tokenizer(), tmp / "tokenizer.json")
    return folder


def to_input_ids(symbols: torch.Tensor, tokenizer: Tokenizer) -> torch.Tensor:
    """(n, T) symbol indices -> (n, T + 1) token ids, `[CLS]` first (no `[SEP]`, as the toy)."""
    first = tokenizer.token_to_id(OPENERS[0])
    cls = torch.full((symbols.size(0), 1), tokenizer.token_to_id("[CLS]"))
    return torch.cat([cls, symbols + first], dim=1)


class BracketsDataModule(L.LightningDataModule):
    """Fresh random sentences for training; a validation set masked once with a fixed seed.
    `out_dir`: where the run's tokenizer is saved (None: not saved)."""

    nsp = False

    def __init__(
        self,
        *,
        n_train: int,
        n_val: int,
        pairs: int,
        max_seq_length: int,
        batch_size: int,
        masking: dict,
        num_workers: int,
        seed: int,
        out_dir: str | None,
    ):
        super().__init__()
        if max_seq_length != 2 * pairs + 1:
            raise ValueError(f"data.max_seq_length={max_seq_length}; expected 2 * pairs + 1")
        self.n_train, self.n_val, self.pairs = n_train, n_val, pairs
        self.max_seq_length = max_seq_length
        self.batch_size, self.num_workers, self.seed = batch_size, num_workers, seed
        self.masking = from_dict(MaskingConfig, masking, "data.masking")
        self.out_dir = out_dir
        self.tokenizer: Tokenizer | None = None  # build_tokenizer()'s
        self.train_set = self.val_set = None

    def build_tokenizer(self, given: Tokenizer | None = None) -> Tokenizer:
        """A run's first step (`setup` takes it when the run has not): the fixed symbol
        vocabulary, saved as `out_dir/tokenizer.json` (`given`, a resumed run's, is the same
        vocabulary: the toy's tokenizer is fixed)."""
        self.tokenizer = brackets_tokenizer()
        if self.out_dir:
            save_tokenizer(self.tokenizer, os.path.join(self.out_dir, "tokenizer.json"))
        return self.tokenizer

    def collator(self) -> MLMCollator:
        return MLMCollator.for_tokenizer(self.tokenizer, self.masking, padded=False)  # (T + 1,)

    def data_record(self, tokenizer: Tokenizer | None = None) -> dict:
        """What the sentences depend on, by config key (as `BertDataModule.data_record`; the
        tokenizer is fixed)."""
        return {
            "data._target_": f"{type(self).__module__}.{type(self).__qualname__}",
            "data.n_train": self.n_train,
            "data.n_val": self.n_val,
            "data.pairs": self.pairs,
            "data.max_seq_length": self.max_seq_length,
            "data.masking": asdict(self.masking),
            "data.seed": self.seed,
            "data.batch_size": self.batch_size,
        }

    def setup(self, stage: str | None = None):
        if self.train_set is not None:
            return
        if self.tokenizer is None:
            self.build_tokenizer()
        g = torch.Generator().manual_seed(self.seed)
        train = to_input_ids(sentences(self.n_train, self.pairs, g), self.tokenizer)
        val = to_input_ids(sentences(self.n_val, self.pairs, g), self.tokenizer)
        val_ids, val_labels = self.collator().mask(val, g)
        self.train_set = [{"input_ids": row} for row in train.tolist()]
        self.val_set = [
            {"input_ids": i, "labels": lab}
            for i, lab in zip(val_ids.tolist(), val_labels.tolist(), strict=True)
        ]

    def _loader(self, ds, shuffle: bool) -> StatefulDataLoader:
        """Shuffled training batches, or each validation example once however many processes
        read them (`EvalBatches`)."""
        batching = (
            {"batch_size": self.batch_size, "shuffle": True}
            if shuffle
            else {"batch_sampler": EvalBatches(len(ds), self.batch_size)}
        )
        return StatefulDataLoader(
            ds, collate_fn=self.collator(), num_workers=self.num_workers, **batching
        )

    def train_dataloader(self):
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self):
        return self._loader(self.val_set, shuffle=False)
