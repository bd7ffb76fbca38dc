"""The pretraining LightningDataModules: thin, they compose the functions of data/pipeline.py.

`BertDataModule` holds what every corpus shares: the tokenizer, the masking collator, the
loaders, and the sets built once per process and run (`prepare_data` on rank 0 and `setup`,
called again by validate-then-fit, reuse them). `PretrainDataModule` builds them from files:
C4 documents -> token ids -> framed examples, with the `examples` function it holds (MLM blocks
here, NSP pairs in data/nsp.py); data/streaming.py streams instead.
"""

from __future__ import annotations

import logging
import shutil
import sys
from dataclasses import asdict
from functools import partial
from pathlib import Path

import datasets
import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from tokenizers import Tokenizer
from torchdata.stateful_dataloader import StatefulDataLoader

from bert_lightning.choices import PACKINGS
from bert_lightning.data.corpus import interleave_documents, resolve_files
from bert_lightning.data.masking import MaskingConfig, MLMCollator
from bert_lightning.data.pipeline import (
    CODE,
    framing,
    hold_out,
    interleaved,
    mask_once,
    mlm_examples,
    read_documents,
)
from bert_lightning.data.prepare import TokenBlocks, cache_folder, prepare
from bert_lightning.data.sampling import EpochSampler, KeepsTrainLoaderPosition, SeededExamples
from bert_lightning.data.tables import EvalBatches
from bert_lightning.data.tokenizer import (
    SPECIAL_TOKENS,
    TokenizerConfig,
    load_tokenizer,
    save_tokenizer,
    train_wordpiece,
)
from bert_lightning.errors import UserError
from bert_lightning.fields import from_dict
from bert_lightning.fingerprints import file_stamps, fingerprint
from bert_lightning.progress import Waiting
from bert_lightning.signals import ignore_stop_signals

log = logging.getLogger(__name__)

CACHE_FORMATS = ("arrow", "tokens")  # tokens: flat token arrays (data/prepare.py)


def tokenizer_cache(cache_dir: str | None) -> Path:
    """Where trained tokenizers are kept: beside the datasets cache (`data.cache_dir`)."""
    return Path(cache_dir or datasets.config.HF_DATASETS_CACHE) / "bert_lightning_tokenizers"


def world_and_rank(trainer) -> tuple[int, int]:
    """This process's share of the training data (all of it outside a trainer)."""
    return (trainer.world_size, trainer.global_rank) if trainer else (1, 0)


class BertDataModule(KeepsTrainLoaderPosition, L.LightningDataModule):
    """Tokenizer, loaders and the once-built sets, from what it is given when built: the
    `data` config and the run folder (`out_dir`, where the tokenizer in use is saved; None: not
    saved); the tokenizer comes first (`build_tokenizer`). A corpus gives `build()`, its
    (train, validation) sets, `tokenizer_documents()`, the stream a tokenizer is trained on,
    and `source()`, where that stream comes from (for an error)."""

    nsp = False  # the examples train NSP too (NSPDataModule's pairs, `data.nsp`)

    def __init__(
        self,
        *,
        val_docs: int,
        max_eval_samples: int | None,
        max_seq_length: int,
        packing: str,
        batch_size: int,
        num_workers: int,
        masking: dict,
        tokenizer: dict,
        on_bad_record: str,
        max_doc_chars: int | None,
        long_docs: str,
        text_unit: str,
        num_proc: int | None,
        cache_dir: str | None,
        seed: int,
        out_dir: str | None,
    ):
        super().__init__()
        if packing not in PACKINGS:
            raise UserError(f"data.packing={packing!r}; expected one of {PACKINGS}")
        if max_seq_length < 3:
            raise UserError(f"data.max_seq_length={max_seq_length}; expected at least 3")
        if max_eval_samples is not None and max_eval_samples < 1:
            raise UserError(
                f"data.max_eval_samples={max_eval_samples}; expected >= 1 or null (all)"
            )
        self.val_docs, self.max_eval_samples = val_docs, max_eval_samples
        self.max_seq_length, self.packing = max_seq_length, packing
        self.batch_size, self.num_workers = batch_size, num_workers
        self.masking = from_dict(MaskingConfig, masking, "data.masking")
        self.tokenizer_cfg = from_dict(TokenizerConfig, tokenizer, "data.tokenizer")
        self.on_bad_record, self.num_proc = on_bad_record, num_proc
        self.max_doc_chars, self.long_docs = max_doc_chars, long_docs
        self.text_unit = text_unit
        self.cache_dir, self.seed = cache_dir, seed
        self.out_dir = out_dir
        self.tokenizer: Tokenizer | None = None  # build_tokenizer()'s
        self.derived: list[Path] = []  # built from the corpus by this run: `setup` keeps or not
        self.train_set = self.val_set = None
        if not sys.stderr.isatty():  # the bars' carriage returns would fill a log file
            datasets.disable_progress_bars()

    # -- tokenizer -------------------------------------------------------------------------
    def build_tokenizer(self, given: Tokenizer | None = None) -> Tokenizer:
        """A run's first step (`setup` takes it when the run has not), in order: `given` (a
        resumed checkpoint's, `init_from=`'s, the evaluated one's), `tokenizer.path`, on a DDP
        rank other than 0 the `tokenizer.json` rank 0 saved, else trained on
        `tokenizer_documents()` (refusing an empty corpus: its tokenizer would hold the special
        tokens only). Saved as `out_dir/tokenizer.json`; `self.tokenizer` from then on."""
        saved = Path(self.out_dir) / "tokenizer.json" if self.out_dir else None
        if given is not None:
            tokenizer = given
        elif self.tokenizer_cfg.path:
            tokenizer = load_tokenizer(self.tokenizer_cfg.path)
        elif saved and saved.is_file() and rank_zero_only.rank > 0:
            tokenizer, saved = load_tokenizer(saved), None  # rank 0's: nothing to write
        else:
            tokenizer = self.trained_tokenizer()
            self.derived += [saved] if saved else []
        if saved:
            save_tokenizer(tokenizer, saved)
        self.tokenizer = tokenizer
        return tokenizer

    def trained_tokenizer(self) -> Tokenizer:
        """A WordPiece tokenizer trained on `tokenizer_documents()`, or the one trained on the
        same files with the same settings before (`tokenizer_key`), read from the cache, so a
        second run on a corpus goes straight to its cached blocks."""
        key = self.tokenizer_key()
        cached = tokenizer_cache(self.cache_dir) / f"wordpiece-{key}.json" if key else None
        if cached and cached.is_file():
            log.info("tokenizer: %s, trained before on the same files and settings", cached)
            return load_tokenizer(cached)
        if next(self.tokenizer_documents(), None) is None:
            raise UserError(
                f"no documents with text in {self.source()} (empty files, or every "
                "record skipped by data.on_bad_record=skip)"
            )
        cfg = self.tokenizer_cfg
        tokenizer = train_wordpiece(
            self.tokenizer_documents,
            vocab_size=cfg.vocab_size,
            min_frequency=cfg.min_frequency,
            max_docs=cfg.max_docs,
        )
        if cached:
            save_tokenizer(tokenizer, cached)
            self.derived.append(cached)
            log.info("tokenizer: cached as %s for the next run on these files", cached)
        return tokenizer

    def tokenizer_key(self) -> str | None:
        """What a trained tokenizer depends on, hashed: None where it is not cached (a
        stream's documents may change; `PretrainDataModule` keys its files)."""
        return None

    def data_record(self, tokenizer: Tokenizer | None = None) -> dict:
        """What the examples of a run depend on, each part under the config key that sets it
        (plain values), the checkpoint's one data record: a resumed run compares its
        checkpoint's record with its own and names the parts that differ (training/resume.py),
        before it writes anything (the tokenizer: the one given, else the one built);
        `evaluate` frames and masks any files as the run framed its validation files."""
        tok = tokenizer or self.tokenizer
        return {
            "data._target_": f"{type(self).__module__}.{type(self).__qualname__}",
            **self.source_record(),
            **{f"data.{k}": v for k, v in self.read_settings().items()},
            "data.tokenizer": fingerprint(tok.to_str()) if tok else None,
            "data.max_seq_length": self.max_seq_length,
            "data.packing": self.packing,
            "data.masking": asdict(self.masking),
            "data.max_eval_samples": self.max_eval_samples,
            "data.seed": self.seed,
            "data.batch_size": self.batch_size,  # a batch's seed masks its rows
        }

    def source_record(self) -> dict:
        """Where the documents come from (`data_record`'s first parts)."""
        raise NotImplementedError

    def read_settings(self) -> dict:
        """How documents are read, by `data` key (`read_options` by `iter_documents`' names)."""
        return {
            "on_bad_record": self.on_bad_record,
            "max_doc_chars": self.max_doc_chars,
            "long_docs": self.long_docs,
            "text_unit": self.text_unit,
        }

    def read_options(self) -> dict:
        read = self.read_settings()
        read["max_chars"] = read.pop("max_doc_chars")
        return read

    def collator(self) -> MLMCollator:
        return MLMCollator.for_tokenizer(
            self.tokenizer,
            self.masking,
            isolate=self.packing == "packed_isolated",
            padded=self.packing == "document",
        )

    # -- the sets, built once --------------------------------------------------------------
    def prepare_data(self):
        self.setup()  # rank 0 builds here, filling the disk cache the other ranks read in setup()

    def setup(self, stage: str | None = None):
        """The sets, built once. A corpus found bad while they are built (a truncated file, a
        bad record) takes what this run built from it along (`derived`: the tokenizer trained
        on its first documents, the token arrays of this tokenizer): a cache entry from bad
        data would be reused by the next run."""
        if self.val_set is None:
            if self.tokenizer is None:
                self.build_tokenizer()
            try:  # a line at least every SECONDS, between and within its steps' own
                with Waiting("building the examples"):
                    self.train_set, self.val_set = self.build()
            except UserError:
                for path in self.derived:
                    if path.is_dir():
                        shutil.rmtree(path)
                    else:
                        path.unlink(missing_ok=True)
                raise

    def bounded(self, examples: datasets.Dataset) -> datasets.Dataset:
        """At most `max_eval_samples` validation examples, evenly spaced over the set (each
        validation file keeps its share), so that validating costs a small part of a budget."""
        n, total = self.max_eval_samples, len(examples)
        if n is None or total <= n:
            return examples
        log.info("validating on %d of %d examples (data.max_eval_samples; null: all)", n, total)
        return examples.select([i * total // n for i in range(n)])

    def _loader(self, ds, sampler=None, batch_sampler=None) -> StatefulDataLoader:
        """Batches of `batch_size` (drawn by `sampler`, if given), or `batch_sampler`'s."""
        batching = (
            {"batch_sampler": batch_sampler}
            if batch_sampler is not None
            else {"batch_size": self.batch_size, "sampler": sampler}
        )
        return StatefulDataLoader(
            ds,
            **batching,
            collate_fn=self.collator(),
            num_workers=self.num_workers,
            worker_init_fn=ignore_stop_signals,
            persistent_workers=self.num_workers > 0,  # no worker restart at each epoch
            pin_memory=torch.cuda.is_available(),  # asynchronous host-to-GPU copies
        )

    def train_dataloader(self):
        """Shuffled per epoch from the seed, this rank's share only (see data/sampling.py); a
        resumed run's at the checkpoint's position."""
        world, rank = world_and_rank(self.trainer)
        sampler = EpochSampler(self.train_set, num_replicas=world, rank=rank, seed=self.seed)
        return self.resumed(self._loader(SeededExamples(self.train_set, self.seed), sampler))

    def val_dataloader(self):
        """Each example once, whatever the number of processes (`EvalBatches`)."""
        return self._loader(
            self.val_set, batch_sampler=EvalBatches(len(self.val_set), self.batch_size)
        )


class PretrainDataModule(BertDataModule):
    """Examples from files. `train_files=None`: validation only, no training set (`bert-lightning
    evaluate`). `examples(docs, tokenizer)`: documents -> examples."""

    def __init__(
        self,
        *,
        train_files: str | list[str] | None,
        val_files: str | list[str] | None,
        cache_format: str,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.train_files = resolve_files(train_files) if train_files is not None else None
        self.val_files = resolve_files(val_files) if val_files else None
        if self.val_files and self.train_files:  # the switch is said, not silent
            log.info(
                "validating on data.val_files (%d files); every document of data.train_files "
                "trains: data.val_docs=%d holds documents out only without data.val_files",
                len(self.val_files),
                self.val_docs,
            )
        if cache_format not in CACHE_FORMATS:
            raise UserError(f"data.cache_format={cache_format!r}; expected one of {CACHE_FORMATS}")
        if cache_format == "tokens" and self.packing == "packed_isolated":
            raise UserError("data.packing=packed_isolated needs data.cache_format=arrow")
        if cache_format == "tokens" and not val_files:
            raise UserError("data.cache_format=tokens needs data.val_files (no held-out split)")
        self.cache_format = cache_format
        self._documents: tuple[datasets.Dataset, datasets.Dataset] | None = None  # documents()
        self.examples = partial(
            mlm_examples,
            packing=self.packing,
            max_seq_length=self.max_seq_length,
            num_proc=self.num_proc,
        )

    def source(self):
        return self.train_files

    def held_out_record(self) -> tuple | None:
        """How validation documents are drawn from `train_files` (None: `val_files` given)."""
        return None if self.val_files else (self.val_docs, self.seed)

    def source_record(self) -> dict:
        stamps = lambda files: [list(s) for s in file_stamps(files)] if files else None
        return {
            "data.train_files": stamps(self.train_files),
            "data.val_files": stamps(self.val_files),
            "data.val_docs": None if self.val_files else self.val_docs,
            "data.cache_format": self.cache_format,
        }

    def tokenizer_key(self) -> str:
        """The training files (paths, sizes, modification times: a changed file trains a new
        tokenizer), how they are read, the documents held out of them, the tokenizer's settings
        and the data code (`pipeline.CODE`)."""
        cfg = self.tokenizer_cfg
        settings = (cfg.vocab_size, cfg.min_frequency, cfg.max_docs, SPECIAL_TOKENS)
        read = sorted(self.read_options().items())
        held = self.held_out_record()
        return fingerprint(file_stamps(self.train_files), read, held, settings, CODE)

    def tokenizer_documents(self):
        """The stream a tokenizer (or `tokenizer.extend`) learns from (its first
        `tokenizer.max_docs` documents): the training documents, never a held-out one, the
        files interleaved (the first document of each, then the second, ...), so that every
        source is in the vocabulary, not only the first."""
        if self.val_files:
            return interleave_documents(self.train_files, **self.read_options())
        train = self.documents()[0]
        return (text for b in train.select(interleaved(train)).iter(1000) for text in b["text"])

    def documents(self) -> tuple[datasets.Dataset, datasets.Dataset]:
        """(training, validation) documents, read once: `train_files` and `val_files`, or
        `val_docs` whole documents held out of `train_files`."""
        if self._documents is None:
            docs = self.read(self.train_files)
            if self.val_files:
                self._documents = docs, self.read(self.val_files)
            else:
                self._documents = hold_out(docs, self.val_docs, self.seed, self.train_files)
        return self._documents

    def read(self, files: list[str]) -> datasets.Dataset:
        return read_documents(files, self.read_options(), self.cache_dir)

    def build(self) -> tuple[datasets.Dataset | TokenBlocks | None, datasets.Dataset]:
        if self.train_files is None:
            return None, self.held_out(self.val_files)
        if self.cache_format == "tokens":
            train_set, val_set = self.token_blocks(), self.held_out(self.val_files)
        else:
            train_docs, val_docs = self.documents()
            train_set = self.examples(train_docs, self.tokenizer)
            if len(train_set) == 0:
                raise UserError(f"no training examples from {self.train_files}")
            val_set = self.validation(val_docs)
        log.info(
            "%d training and %d validation examples (%s)",
            len(train_set),
            len(val_set),
            self.packing,
        )
        return train_set, val_set

    def token_blocks(self) -> TokenBlocks:
        """Training examples memory-mapped from flat token arrays, prepared once."""
        out = cache_folder(self.cache_dir or datasets.config.HF_DATASETS_CACHE, self.tokenizer)
        self.derived += [] if out.exists() else [out]
        read = self.read_options()
        prepare(self.train_files, out, self.tokenizer, self.num_proc or 1, read)
        how = framing(self.tokenizer, self.packing, self.max_seq_length)
        return TokenBlocks(self.train_files, out, read, **how)

    def validation(self, docs: datasets.Dataset) -> datasets.Dataset:
        """Held-out documents -> examples masked once, with the seed."""
        return mask_once(
            self.bounded(self.examples(docs, self.tokenizer)), self.collator(), self.seed
        )

    def held_out(self, files: list[str]) -> datasets.Dataset:
        """The documents of `files` as validation examples (`bert-lightning evaluate` scores a
        checkpoint on any corpus this way)."""
        return self.validation(self.read(files))
