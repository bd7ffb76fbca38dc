import os

import numpy as np
import pytest

from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.prepare import TokenBlocks, cache_folder, prepare, shard_paths
from helpers import data_module, write_corpus


def shards(tmp_path, n=3, docs=20):
    """n shard files of the bundled sample, `docs` documents each."""
    full = write_corpus(tmp_path / "all.jsonl", n * docs).read_text().splitlines(keepends=True)
    out = []
    for i in range(n):
        p = tmp_path / f"c4-train.{i:05d}-of-{n:05d}.json"
        p.write_text("".join(full[i * docs : (i + 1) * docs]))
        out.append(str(p))
    return out


def test_prepared_arrays_hold_each_documents_tokens(tmp_path, tiny_tokenizer):
    files = shards(tmp_path)
    out = cache_folder(tmp_path / "cache", tiny_tokenizer)
    prepare(files, out, tiny_tokenizer, num_proc=2, read={})
    for f in files:
        tokens_path, docs_path = shard_paths(out, f, {})
        tokens = np.fromfile(tokens_path, dtype=np.uint16)  # vocab < 65,536: 2 bytes a token
        ends = np.load(docs_path)
        docs = list(iter_documents([f]))
        expected = [e.ids for e in tiny_tokenizer.encode_batch(docs, add_special_tokens=False)]
        assert len(ends) == len(docs) and ends[-1] == len(tokens)
        starts = [0, *ends[:-1]]
        assert [tokens[s:e].tolist() for s, e in zip(starts, ends, strict=True)] == expected
    blocks = TokenBlocks(files, out, {}, block=30, cls_id=2, sep_id=3, packing="packed")
    joined = np.concatenate([np.fromfile(shard_paths(out, f, {})[0], np.uint16) for f in files[:1]])
    assert blocks[0]["input_ids"] == [2, *joined[:30].tolist(), 3]
    n0 = len(joined) // 30
    assert (
        len(blocks) > n0
        and blocks[n0]["input_ids"][1:-1]
        == np.fromfile(shard_paths(out, files[1], {})[0], np.uint16)[:30].tolist()
    )  # the second shard's first block


def test_restart_skips_finished_shards_and_redoes_a_crashed_one(tmp_path, tiny_tokenizer):
    files = shards(tmp_path)
    out = cache_folder(tmp_path / "cache", tiny_tokenizer)
    prepare(files, out, tiny_tokenizer, 1, {})
    done = {f: os.stat(shard_paths(out, f, {})[1]).st_mtime_ns for f in files}
    good = shard_paths(out, files[1], {})[0].read_bytes()
    # a crash halfway through shard 1: its tokens half written, no `.docs.npy` marker
    tokens_path, docs_path = shard_paths(out, files[1], {})
    tokens_path.write_bytes(good[: len(good) // 2])
    docs_path.unlink()
    prepare(files, out, tiny_tokenizer, 1, {})
    assert tokens_path.read_bytes() == good  # redone
    for f in (files[0], files[2]):  # not redone
        assert os.stat(shard_paths(out, f, {})[1]).st_mtime_ns == done[f]
    assert not [p for p in out.iterdir() if ".tmp" in p.name]


def test_datamodule_trains_from_the_token_arrays(tmp_path, tiny_tokenizer):
    files = shards(tmp_path)
    val = str(write_corpus(tmp_path / "val.jsonl", 5))
    kw = dict(val_files=val, max_seq_length=32, batch_size=4, cache_dir=str(tmp_path / "c"))
    kw["given_tokenizer"] = tiny_tokenizer
    arrow = data_module(train_files=files, **kw)
    tokens = data_module(train_files=files, cache_format="tokens", **kw)
    for dm in (arrow, tokens):
        dm.setup()
    assert isinstance(tokens.train_set, TokenBlocks)
    # the same token stream: per shard here, per map batch of 1,000 documents there
    flat = [t for r in tokens.train_set for t in r["input_ids"][1:-1]]
    assert len(flat) == len(tokens.train_set) * 30
    assert 0 <= len(arrow.train_set) - len(tokens.train_set) <= 3  # at most a tail per shard
    batch = next(iter(tokens.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32) and (batch["labels"] != -100).any()
    with pytest.raises(ValueError, match="cache_format=tokens needs data.val_files"):
        data_module(train_files=files, cache_format="tokens")
