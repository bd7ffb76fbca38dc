"""The pretraining data as plain functions, one per stage: read -> tokenize -> frame, and for
validation hold out -> mask once. Each takes and returns a `datasets.Dataset`; the DataModules
(data/pretraining.py, data/nsp.py) compose them, and data/streaming.py maps the same batch functions
over a stream.

Documents are read once into an Arrow dataset (`datasets`, memory-mapped and cached on disk),
tokenized with a batched `map`, then framed either *packed* (documents concatenated and cut
into full blocks, no padding; with `packed_isolated` each document attends to itself alone)
or *per document* (truncated, padded per batch). Every step has a
fingerprint of its inputs, so the same step on another rank reads the cache.
"""

from __future__ import annotations

import logging
from pathlib import Path

import datasets
import numpy as np
import pyarrow.compute as pc
import tokenizers
import torch
from tokenizers import Tokenizer

from bert_lightning.data.corpus import BadRecordError, iter_documents, numbered_documents
from bert_lightning.data.masking import MLMCollator
from bert_lightning.data.tokenizer import batch_encode, special_ids
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import file_stamps, fingerprint
from bert_lightning.progress import Ticks

log = logging.getLogger(__name__)

# the data layer's code (every module of this folder) and the tokenizers release: part of every
# data cache's key, so that a new version that reads, tokenizes, frames or masks otherwise
# never reuses what an older one cached
CODE = fingerprint(
    tokenizers.__version__, *(p.read_bytes() for p in sorted(Path(__file__).parent.glob("*.py")))
)


def map_procs(docs: datasets.Dataset, num_proc: int | None) -> int | None:
    """Processes for a `map`: worth starting from 10,000 documents on."""
    return num_proc if num_proc and len(docs) >= 10_000 else None


def text_rows(
    files: list[str],
    index: list[int] | None = None,
    stamp: list | None = None,
    code: str | None = None,
    **read,
):
    """Generator for `(Iterable)Dataset.from_generator`: each document's `text`, its `file`
    (`index[i]` for `files[i]`: `datasets` hands each call a share of the lists) and its number
    in the file (`doc`, shared by the pieces of a split document: `hold_out` draws whole ones);
    `stamp` (`file_stamps`) and `code` (`CODE`) only feed the cache fingerprint."""
    ticks = Ticks(f"reading {len(files)} files")
    index = index or range(len(files))
    for i, doc, text in numbered_documents(files, **read):
        ticks()
        yield {"text": text, "file": index[i], "doc": doc}


ROW_FEATURES = datasets.Features(
    {
        "text": datasets.Value("string"),
        "file": datasets.Value("int32"),
        "doc": datasets.Value("int64"),
    }
)


def read_documents(files: list[str], read: dict, cache_dir: str | None = None) -> datasets.Dataset:
    """Every document of `files` (`text_rows`); `read`: the options of `iter_documents`."""
    if next(iter_documents(files, **read), None) is None:
        raise UserError(f"no documents with text in {files}")
    try:
        return datasets.Dataset.from_generator(
            text_rows,
            features=ROW_FEATURES,
            gen_kwargs={
                "files": files,
                "index": list(range(len(files))),
                "stamp": file_stamps(files),
                "code": CODE,
                **read,
            },
            cache_dir=cache_dir,
        )
    except datasets.exceptions.DatasetGenerationError as e:
        if isinstance(e.__cause__, BadRecordError):  # datasets wraps it; show it plainly
            raise e.__cause__ from None
        raise


def encode(batch, tokenizer: Tokenizer, ticks: Ticks | None = None):
    """A `map` batch of documents -> their token ids (no special tokens)."""
    if ticks:
        ticks(len(batch["text"]))
    return {"input_ids": batch_encode(tokenizer, batch["text"])}


def framing(tokenizer: Tokenizer, packing: str, max_seq_length: int) -> dict:
    """The arguments of `frame_batch` and `prepare.TokenBlocks`: the same framing for cached,
    streamed, memory-mapped and validation data."""
    ids = special_ids(tokenizer)
    return {
        "cls_id": ids["[CLS]"],
        "sep_id": ids["[SEP]"],
        "block": max_seq_length - 2,
        "packing": packing,
    }


def framed(ids, cls_id: int, sep_id: int) -> list[int]:
    """`[CLS] ids [SEP]`: the one framing of an example (`ids` at most a block), for mapped,
    streamed and memory-mapped (`prepare.TokenBlocks`) token ids alike, and of a whole
    document before `packed_isolated` cuts the blocks."""
    return [cls_id, *ids, sep_id]


def frame_batch(batch, cls_id: int, sep_id: int, block: int, packing: str, ticks=None):
    """Token ids of documents -> `[CLS] ... [SEP]` examples of at most `block + 2` tokens."""
    if ticks:
        ticks(len(batch["input_ids"]))
    if packing == "document":
        return {"input_ids": [framed(ids[:block], cls_id, sep_id) for ids in batch["input_ids"]]}
    if packing == "packed_isolated":  # blocks of whole-framed documents, no extra [CLS]/[SEP]
        flat = [t for ids in batch["input_ids"] for t in framed(ids, cls_id, sep_id)]
        n = len(flat) // (block + 2)
        return {"input_ids": [flat[i * (block + 2) : (i + 1) * (block + 2)] for i in range(n)]}
    flat = [t for ids in batch["input_ids"] for t in ids]
    n = len(flat) // block  # the tail of a map batch (< one block per 1,000 docs) is dropped
    return {
        "input_ids": [framed(flat[i * block : (i + 1) * block], cls_id, sep_id) for i in range(n)]
    }


def shown_total(docs: datasets.Dataset, procs: int | None) -> int | None:
    """The documents a `map`'s progress counts towards: each of `procs` processes counts its
    own share, whose size the lines leave out."""
    return None if procs else len(docs)


def tokenize(
    docs: datasets.Dataset, tokenizer: Tokenizer, num_proc: int | None = None
) -> datasets.Dataset:
    """`text` -> `input_ids`, one row per document, in the documents' order; batches of 100
    documents, so that a progress line is never long due (a batch of a thousand book-length
    documents takes minutes). `map` gives each process a contiguous share, and the files'
    long documents (books after articles) would all fall to the last: each process takes
    every `procs`-th document instead."""
    procs = map_procs(docs, num_proc)
    order = strided(len(docs), procs) if procs else None
    tokens = (docs if order is None else docs.select(order)).map(
        encode,
        batched=True,
        batch_size=100,
        fn_kwargs={"tokenizer": tokenizer, "ticks": Ticks("tokenizing", shown_total(docs, procs))},
        remove_columns=docs.column_names,
        num_proc=procs,
        new_fingerprint=fingerprint(docs._fingerprint, tokenizer.to_str(), procs),
        desc="tokenizing",
    )
    return tokens if order is None else tokens.select(np.argsort(order))


def strided(n: int, procs: int) -> np.ndarray:
    """0, procs, 2 procs, ..., 1, procs + 1, ...: `map`'s contiguous shards of `n` rows put in
    this order hold every `procs`-th row each (shard i has `n // procs` rows, one more for the
    first `n % procs`, as many as i, i + procs, ... below n)."""
    return np.concatenate([np.arange(i, n, procs) for i in range(procs)])


def frame(tokens: datasets.Dataset, how: dict, num_proc: int | None = None) -> datasets.Dataset:
    """Documents' `input_ids` -> framed examples; `how`: `framing(...)`."""
    procs = map_procs(tokens, num_proc)
    return tokens.map(
        frame_batch,
        batched=True,
        batch_size=1000,
        fn_kwargs=how | {"ticks": Ticks("framing", shown_total(tokens, procs))},
        num_proc=procs,
        new_fingerprint=fingerprint(tokens._fingerprint, how),
        desc=f"framing ({how['packing']})",
    )


def mlm_examples(
    docs: datasets.Dataset,
    tokenizer: Tokenizer,
    packing: str,
    max_seq_length: int,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """Documents -> MLM examples: tokenized, then framed."""
    how = framing(tokenizer, packing, max_seq_length)
    return frame(tokenize(docs, tokenizer, num_proc), how, num_proc)


def documents(docs: datasets.Dataset) -> np.ndarray:
    """(rows,) each row's document, numbered 0, 1, ... in reading order (`read_documents`' rows,
    in their order: a row's `file` and `doc` name it)."""
    file, doc = np.asarray(docs["file"]), np.asarray(docs["doc"])  # (rows,) each
    new = np.diff(file, prepend=-1) != 0
    new |= np.diff(doc, prepend=-1) != 0  # (rows,) a document's first row
    return np.cumsum(new) - 1


def hold_out(
    docs: datasets.Dataset, val_docs: int, seed: int, source: object = "the corpus"
) -> tuple[datasets.Dataset, datasets.Dataset]:
    """(training, validation) rows of `docs` (`read_documents`'): `val_docs` whole documents
    drawn with the seed, every piece of a split document on the side its document is, so no
    validation text is trained on. The draw is `train_test_split`'s (a permutation of the
    documents by `np.random.default_rng(seed)`, the first `val_docs` held out)."""
    doc = documents(docs)  # (rows,)
    n = int(doc[-1]) + 1 if len(doc) else 0
    if n <= val_docs:
        raise UserError(
            f"{n} documents in {source}: too few to hold out "
            f"data.val_docs={val_docs} for validation"
        )
    order = np.random.default_rng(seed).permutation(n)  # (n,)
    starts = np.searchsorted(doc, np.arange(n + 1))  # (n + 1,) first row of each document

    def rows(documents: np.ndarray) -> np.ndarray:  # (pieces of `documents`,) in their order
        lengths = starts[documents + 1] - starts[documents]  # (len(documents),)
        first = np.repeat(starts[documents] - np.cumsum(lengths) + lengths, lengths)
        return first + np.arange(lengths.sum())

    held = rows(order[:val_docs])
    say_held_out(docs, held, val_docs, n)
    return docs.select(rows(order[val_docs:])), docs.select(held)


HELD_OUT_WARNING = 0.1  # of the corpus's text: past it, a held-out set costs training much


def say_held_out(docs: datasets.Dataset, held: np.ndarray, val_docs: int, n: int) -> None:
    """One line: how much of the text the held-out documents take from training, a warning
    past a tenth (a document may be a book: 50 books of 149 are a third of the text)."""
    chars = pc.utf8_length(docs.data.column("text")).to_numpy(zero_copy_only=False)  # (rows,)
    share = chars[held].sum() / max(1, chars.sum())
    line = "data.val_docs=%d holds out %d of %d documents, %.1f%% of the text, from training"
    if share > HELD_OUT_WARNING:
        log.warning(
            line + "; lower data.val_docs (a document may be a whole book) or give data.val_files",
            *(val_docs, val_docs, n, 100 * share),
        )
    else:
        log.info(line, val_docs, val_docs, n, 100 * share)


def interleaved(docs: datasets.Dataset) -> np.ndarray:
    """Row indices of `docs` (`read_documents`' rows, in any order) in reading order with the
    files interleaved: the first document of each file, then the second of each, ..., as
    `corpus.interleave_documents` reads files."""
    # both columns read at once as arrays: np.asarray of a datasets Column reads row by row
    columns = docs.select_columns(["file", "doc"]).with_format("numpy")[:]
    pos = np.lexsort((columns["doc"], columns["file"]))  # (rows,) as read
    file = columns["file"][pos]  # (rows,)
    by_file = np.argsort(file, kind="stable")  # (rows,)
    rank = np.empty(len(file), np.int64)  # (rows,) the row's place within its file
    rank[by_file] = np.arange(len(file)) - np.searchsorted(file[by_file], file[by_file])
    return pos[np.lexsort((file, rank))]


def _mask_batch(batch, indices, collator: MLMCollator, seed: int):
    g = torch.Generator().manual_seed(seed + indices[0])
    ids, labels = [], []
    for row in batch["input_ids"]:
        m, lab = collator.mask(torch.tensor([row]), g)
        ids.append(m[0].tolist())
        labels.append(lab[0].tolist())
    return {"input_ids": ids, "labels": labels}


def mask_once(examples: datasets.Dataset, collator: MLMCollator, seed: int) -> datasets.Dataset:
    """Fixed validation masks, so the validation loss is comparable across evaluations: seeded
    by the position of the batch, not by run or epoch."""
    return examples.map(
        _mask_batch,
        batched=True,
        with_indices=True,
        fn_kwargs={"collator": collator, "seed": seed},
        new_fingerprint=fingerprint(examples._fingerprint, collator.masking, seed),
        desc="masking validation",
    )
