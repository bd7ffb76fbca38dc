"""The MLM pretraining LightningDataModule: C4 documents -> token ids -> framed examples.

Documents are read once into an Arrow dataset (`datasets`, memory-mapped and cached on disk),
tokenized with a batched `map`, then framed either *packed* (documents concatenated and cut
into full blocks, no padding) or *per document* (truncated, padded per batch).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import datasets
import lightning as L
import torch
from tokenizers import Tokenizer
from torchdata.stateful_dataloader import StatefulDataLoader

from bert_lightning.data.corpus import BadRecordError, iter_documents, resolve_files
from bert_lightning.data.masking import MaskingConfig, MLMCollator
from bert_lightning.data.prepare import TokenBlocks, cache_folder, prepare
from bert_lightning.data.sampling import EpochSampler, SeededExamples
from bert_lightning.data.tokenizer import (
    TokenizerConfig,
    batch_encode,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    train_wordpiece,
)
from bert_lightning.errors import UserError
from bert_lightning.fields import from_dict

log = logging.getLogger(__name__)

PACKINGS = ("packed", "document")
# what the examples train: MLM alone, or MLM + NSP on sentence pairs (the module adds the loss)
OBJECTIVES = ("mlm", "mlm_nsp")
CACHE_FORMATS = ("arrow", "tokens")  # tokens: flat token arrays (data/prepare.py)
BUNDLED_SAMPLE = str(Path(__file__).parents[1] / "assets" / "c4_sample.jsonl")


def _documents(files: list[str], stamp: list, **read):
    """Generator for `Dataset.from_generator`; `stamp` (sizes and mtimes) only feeds the
    cache fingerprint, so that an edited file is read again."""
    for text in iter_documents(files, **read):
        yield {"text": text}


def _fingerprint(*parts) -> str:
    """A `datasets` cache key for a step: every input that changes its output."""
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _tokenize(batch, tokenizer: Tokenizer):
    return {"input_ids": batch_encode(tokenizer, batch["text"])}


def _frame(batch, cls_id: int, sep_id: int, block: int, packing: str):
    """Token ids of documents -> `[CLS] ... [SEP]` examples of at most `block + 2` tokens."""
    if packing == "document":
        return {"input_ids": [[cls_id, *ids[:block], sep_id] for ids in batch["input_ids"]]}
    flat = [t for ids in batch["input_ids"] for t in ids]
    n = len(flat) // block  # the tail of a map batch (< one block per 1,000 docs) is dropped
    return {"input_ids": [[cls_id, *flat[i * block : (i + 1) * block], sep_id] for i in range(n)]}


def _mask_once(batch, indices, collator: MLMCollator, seed: int):
    """Fixed validation masks: seeded by the position of the batch, not by run or epoch."""
    g = torch.Generator().manual_seed(seed + indices[0])
    ids, labels = [], []
    for row in batch["input_ids"]:
        m, lab = collator.mask(torch.tensor([row]), g)
        ids.append(m[0].tolist())
        labels.append(lab[0].tolist())
    return {"input_ids": ids, "labels": labels}


class PretrainDataModule(L.LightningDataModule):
    objective = "mlm"  # what the examples train (NSPDataModule: mlm_nsp)

    def __init__(
        self,
        train_files: str | list[str] | None = BUNDLED_SAMPLE,
        val_files: str | list[str] | None = None,
        val_docs: int = 50,
        max_seq_length: int = 128,
        packing: str = "packed",
        batch_size: int = 32,
        num_workers: int = 0,
        masking: dict | None = None,
        tokenizer: dict | None = None,
        on_bad_record: str = "error",
        max_doc_chars: int | None = 1_000_000,
        text_unit: str = "block",
        cache_format: str = "arrow",
        num_proc: int | None = None,
        cache_dir: str | None = None,
        seed: int = 1234,
    ):
        super().__init__()
        if packing not in PACKINGS:
            raise UserError(f"data.packing={packing!r}; expected one of {PACKINGS}")
        if max_seq_length < 3:
            raise UserError(f"data.max_seq_length={max_seq_length}; expected at least 3")
        # None: a subclass brings its own documents (data/streaming.py)
        self.train_files = resolve_files(train_files) if train_files is not None else None
        self.val_files = resolve_files(val_files) if val_files else None
        if self.val_files and self.train_files:  # the switch is said, not silent
            log.info(
                "validating on data.val_files (%d files); every document of data.train_files "
                "trains: data.val_docs=%d holds documents out only without data.val_files",
                len(self.val_files),
                val_docs,
            )
        self.val_docs = val_docs
        self.max_seq_length, self.packing = max_seq_length, packing
        self.batch_size, self.num_workers = batch_size, num_workers
        self.masking = from_dict(MaskingConfig, masking, "data.masking")
        self.tokenizer_cfg = from_dict(TokenizerConfig, tokenizer, "data.tokenizer")
        self.on_bad_record, self.num_proc = on_bad_record, num_proc
        self.max_doc_chars, self.text_unit = max_doc_chars, text_unit
        if cache_format not in CACHE_FORMATS:
            raise UserError(f"data.cache_format={cache_format!r}; expected one of {CACHE_FORMATS}")
        if cache_format == "tokens" and not val_files:
            raise UserError("data.cache_format=tokens needs data.val_files (no held-out split)")
        self.cache_format = cache_format
        self.cache_dir, self.seed = cache_dir, seed
        self.tokenizer: Tokenizer | None = None
        self.train_set = self.val_set = None

    # -- tokenizer -------------------------------------------------------------------------
    def build_tokenizer(
        self, out_dir: str | os.PathLike, tokenizer_json: str | None = None
    ) -> Tokenizer:
        """In order: `tokenizer_json` (a resumed checkpoint's), `tokenizer.path`, the run's own
        `tokenizer.json` if it exists (DDP ranks reuse rank 0's), else train one on the training
        files (refusing an empty corpus: its tokenizer would hold the special tokens only). The
        tokenizer in use is always saved as `out_dir/tokenizer.json`."""
        saved = Path(out_dir) / "tokenizer.json"
        if tokenizer_json:
            self.tokenizer = Tokenizer.from_str(tokenizer_json)
        elif self.tokenizer_cfg.path:
            self.tokenizer = load_tokenizer(self.tokenizer_cfg.path)
        elif saved.is_file():
            self.tokenizer = load_tokenizer(saved)
            return self.tokenizer
        else:
            if (
                self.train_files is not None
                and next(self.documents(self.train_files), None) is None
            ):
                raise ValueError(f"no documents with text in {self.train_files}")
            self.tokenizer = train_wordpiece(
                self.tokenizer_documents,
                vocab_size=self.tokenizer_cfg.vocab_size,
                min_frequency=self.tokenizer_cfg.min_frequency,
                max_docs=self.tokenizer_cfg.max_docs,
            )
        save_tokenizer(self.tokenizer, saved)
        return self.tokenizer

    def read_options(self) -> dict:
        return {
            "on_bad_record": self.on_bad_record,
            "max_chars": self.max_doc_chars,
            "text_unit": self.text_unit,
        }

    def documents(self, files: list[str]):
        return iter_documents(files, **self.read_options())

    def tokenizer_documents(self):
        """The stream a tokenizer is trained on (its first `tokenizer.max_docs` documents)."""
        return self.documents(self.train_files)

    def collator(self) -> MLMCollator:
        return MLMCollator.for_tokenizer(self.tokenizer, self.masking)

    # -- datasets --------------------------------------------------------------------------
    def _read(self, files: list[str]) -> datasets.Dataset:
        if next(self.documents(files), None) is None:
            raise UserError(f"no documents with text in {files}")
        stamp = [(f, os.path.getsize(f), os.path.getmtime(f)) for f in files]
        try:
            ds = datasets.Dataset.from_generator(
                _documents,
                features=datasets.Features({"text": datasets.Value("string")}),
                gen_kwargs={"files": files, "stamp": stamp, **self.read_options()},
                cache_dir=self.cache_dir,
            )
        except datasets.exceptions.DatasetGenerationError as e:
            if isinstance(e.__cause__, BadRecordError):  # datasets wraps it; show it plainly
                raise e.__cause__ from None
            raise
        return ds

    def _frame_kwargs(self) -> dict:
        """What `_frame` needs: the same framing for cached, streamed and validation data."""
        ids = special_ids(self.tokenizer)
        return {
            "cls_id": ids["[CLS]"],
            "sep_id": ids["[SEP]"],
            "block": self.max_seq_length - 2,
            "packing": self.packing,
        }

    def _examples(self, docs: datasets.Dataset) -> datasets.Dataset:
        num_proc = self.num_proc if self.num_proc and len(docs) >= 10_000 else None
        tokens = docs.map(
            _tokenize,
            batched=True,
            fn_kwargs={"tokenizer": self.tokenizer},
            remove_columns=docs.column_names,
            num_proc=num_proc,
            new_fingerprint=_fingerprint(docs._fingerprint, self.tokenizer.to_str()),
            desc="tokenizing",
        )
        return tokens.map(
            _frame,
            batched=True,
            batch_size=1000,
            fn_kwargs=self._frame_kwargs(),
            num_proc=num_proc,
            new_fingerprint=_fingerprint(tokens._fingerprint, self.packing, self.max_seq_length),
            desc=f"framing ({self.packing})",
        )

    def _build(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        if self.tokenizer is None:
            raise RuntimeError("call build_tokenizer(out_dir) before preparing the data")
        if self.cache_format == "tokens":
            return self._token_blocks(), self.held_out(self.val_files)
        docs = self._read(self.train_files)
        if self.val_files:
            train_docs, val_docs = docs, self._read(self.val_files)
        else:
            if len(docs) <= self.val_docs:
                raise UserError(
                    f"{len(docs)} documents in {self.train_files}: too few to hold out "
                    f"data.val_docs={self.val_docs} for validation"
                )
            split = docs.train_test_split(test_size=self.val_docs, seed=self.seed)
            train_docs, val_docs = split["train"], split["test"]
        train_set = self._examples(train_docs)
        if len(train_set) == 0:
            raise UserError(f"no training examples from {self.train_files}")
        return train_set, self._validation(val_docs)

    def _token_blocks(self) -> TokenBlocks:
        """Training examples memory-mapped from flat token arrays, prepared once."""
        out = cache_folder(self.cache_dir or datasets.config.HF_DATASETS_CACHE, self.tokenizer)
        prepare(self.train_files, out, self.tokenizer, self.num_proc or 1, self.read_options())
        ids = special_ids(self.tokenizer)
        return TokenBlocks(
            self.train_files,
            out,
            self.max_seq_length - 2,
            ids["[CLS]"],
            ids["[SEP]"],
            self.packing,
        )

    def held_out(self, files: list[str]) -> datasets.Dataset:
        """The documents of `files` as validation examples: framed, then masked with the seed
        (`bert-lightning evaluate` scores a checkpoint on any corpus this way)."""
        return self._validation(self._read(files))

    def _validation(self, val_docs: datasets.Dataset) -> datasets.Dataset:
        """Held-out documents -> examples masked once, with a fixed seed."""
        val_examples = self._examples(val_docs)
        return val_examples.map(
            _mask_once,
            batched=True,
            with_indices=True,
            fn_kwargs={"collator": self.collator(), "seed": self.seed},
            new_fingerprint=_fingerprint(val_examples._fingerprint, self.masking, self.seed),
            desc="masking validation",
        )

    def prepare_data(self):
        self.setup()  # rank 0 builds here, filling the disk cache the other ranks read in setup()

    def setup(self, stage: str | None = None):
        """Builds once per process: validate-then-fit and prepare_data reuse the sets."""
        if self.train_set is None:
            self.train_set, self.val_set = self._build()
            log.info(
                "%d training and %d validation examples (%s)",
                len(self.train_set),
                len(self.val_set),
                self.packing,
            )

    def _loader(self, ds, sampler=None) -> StatefulDataLoader:
        return StatefulDataLoader(
            ds,
            batch_size=self.batch_size,
            sampler=sampler,
            collate_fn=self.collator(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,  # no worker restart at each epoch
            pin_memory=torch.cuda.is_available(),  # asynchronous host-to-GPU copies
        )

    def train_dataloader(self):
        """Shuffled per epoch from the seed, this rank's share only (see data/sampling.py)."""
        world, rank = (
            (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        )
        sampler = EpochSampler(self.train_set, num_replicas=world, rank=rank, seed=self.seed)
        return self._loader(SeededExamples(self.train_set, self.seed), sampler)

    def val_dataloader(self):
        return self._loader(self.val_set)
