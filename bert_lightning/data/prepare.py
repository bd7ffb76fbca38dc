"""Tokenizing a corpus once into flat token arrays, shard by shard, in parallel processes.

Each input file becomes `<name>.<key>.tokens` (uint16 token ids, uint32 from a vocab of 65,536
on) and `<name>.<key>.docs.npy` (the end offset of each document), under a folder named by the
tokenizer's hash; `<key>` fingerprints the file and how it is read (`shard_paths`). Both are
written to temporary names and renamed; `.docs.npy` last, so it marks a finished shard: a rerun
skips finished shards and redoes a shard that crashed halfway. Training reads
blocks through `np.memmap`, so a process holds the index only (one offset per block), not the
corpus. Why flat arrays and not the `datasets` Arrow cache: see `bench/data_pipeline.py`
(half the bytes per token, and faster random block reads).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from bert_lightning.atomic import atomic_path
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.pipeline import CODE, framed
from bert_lightning.fingerprints import file_stamps, fingerprint


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= 65_536 else np.uint32)


def cache_folder(root: str | os.PathLike, tokenizer: Tokenizer) -> Path:
    """One folder per tokenizer: a different vocabulary never reads stale ids."""
    return Path(root) / f"tokens-{fingerprint(tokenizer.to_str())[:16]}"


def shard_paths(out_dir: Path, src: str, read: dict) -> tuple[Path, Path]:
    """A shard's two files, named by its file's path, size and modification time, the `read`
    options (`iter_documents`') and the data code (`pipeline.CODE`): two files of one name, an
    edited file, other reading options or another version never share a shard."""
    key = fingerprint(file_stamps([src]), sorted(read.items()), CODE)[:16]
    stem = f"{Path(src).name}.{key}"
    return out_dir / f"{stem}.tokens", out_dir / f"{stem}.docs.npy"


def _write(path: Path, write) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        write(f)


def prepare_shard(src: str, out_dir: Path, tokenizer_json: str, read: dict) -> int:
    """Tokenize one file into its two arrays; returns its token count."""
    tok = Tokenizer.from_str(tokenizer_json)
    dtype = token_dtype(tok.get_vocab_size())
    tokens_path, docs_path = shard_paths(out_dir, src, read)
    ends, total = [], 0
    batch: list[str] = []

    def flush(f):
        nonlocal total
        for e in tok.encode_batch(batch, add_special_tokens=False):
            f.write(np.asarray(e.ids, dtype=dtype).tobytes())
            total += len(e.ids)
            ends.append(total)
        batch.clear()

    def write_tokens(f):
        for text in iter_documents([src], **read):
            batch.append(text)
            if len(batch) == 1000:
                flush(f)
        flush(f)

    _write(tokens_path, write_tokens)
    _write(docs_path, lambda f: np.save(f, np.asarray(ends, dtype=np.int64)))
    return total


def prepare(
    files: list[str],
    out_dir: Path,
    tokenizer: Tokenizer,
    num_proc: int,
    read: dict,
) -> None:
    """Tokenize every file not yet finished, `num_proc` at a time, with a progress bar."""
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [f for f in files if not shard_paths(out_dir, f, read)[1].is_file()]
    args = (out_dir, tokenizer.to_str(), dict(read))
    with tqdm(total=len(files), initial=len(files) - len(todo), desc="tokenizing shards") as bar:
        if num_proc > 1 and len(todo) > 1:  # closed on a bad shard too: the error line is last
            with ProcessPoolExecutor(min(num_proc, len(todo))) as pool:
                for _ in pool.map(prepare_shard, todo, *([a] * len(todo) for a in args)):
                    bar.update()
        else:
            for f in todo:
                prepare_shard(f, *args)
                bar.update()


class TokenBlocks(Dataset):
    """Examples read from prepared shards: `packed` blocks of `block` tokens (documents joined
    within a shard, each shard's tail dropped) or one truncated example per `document`.
    The memory maps open lazily, so each data loader worker opens its own."""

    def __init__(
        self, files, out_dir, read: dict, block: int, cls_id: int, sep_id: int, packing: str
    ):
        self.paths = [shard_paths(Path(out_dir), f, read) for f in files]
        self.block, self.cls_id, self.sep_id, self.packing = block, cls_id, sep_id, packing
        counts = []
        for _, docs_path in self.paths:
            ends = np.load(docs_path, mmap_mode="r")
            n_tokens = int(ends[-1]) if len(ends) else 0
            counts.append(n_tokens // block if packing == "packed" else len(ends))
        self.offsets = np.cumsum([0, *counts])  # (shards + 1,) first example of each shard
        self._maps: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def _shard(self, s: int):
        if s not in self._maps:
            tokens_path, docs_path = self.paths[s]
            ends = np.load(docs_path, mmap_mode="r")  # a shard indexed here has tokens
            itemsize = tokens_path.stat().st_size // int(ends[-1])  # 2 (uint16) or 4
            self._maps[s] = (np.memmap(tokens_path, dtype=f"u{itemsize}", mode="r"), ends)
        return self._maps[s]

    def __getitem__(self, i: int) -> dict:
        s = int(np.searchsorted(self.offsets, i, side="right")) - 1
        j = i - int(self.offsets[s])
        tokens, ends = self._shard(s)
        if self.packing == "packed":
            ids = tokens[j * self.block : (j + 1) * self.block]
        else:
            start = int(ends[j - 1]) if j else 0
            ids = tokens[start : min(int(ends[j]), start + self.block)]
        return {"input_ids": framed(ids.tolist(), self.cls_id, self.sep_id)}
