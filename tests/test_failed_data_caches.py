"""A run that finds its corpus bad stops in one line and leaves nothing it built from
it: not the tokenizer trained on the first documents of a truncated `.json.gz` (cached, the
next run on the same file would take it as trained before), not the run's `tokenizer.json`,
not a token-array folder of that tokenizer."""

import gzip

import pytest

from helpers import cli_error, tiny_overrides, write_corpus


@pytest.mark.parametrize("cache_format", ["arrow", "tokens"])
def test_a_truncated_corpus_fails_in_one_line_and_leaves_no_cache(tmp_path, capsys, cache_format):
    data = gzip.compress(write_corpus(tmp_path / "whole.jsonl", 200).read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    val = write_corpus(tmp_path / "val.jsonl", 10)
    out, cache = tmp_path / "run", tmp_path / "run" / "hf_cache"
    extra = [f"data.train_files={cut}", f"data.val_files={val}", "data.tokenizer.max_docs=20"]
    extra += [f"data.cache_format={cache_format}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    err = cli_error(capsys, "pretrain", *tiny_overrides(out, *extra))
    assert err.startswith(f"error: {cut}: unreadable after line ")
    assert not list(cache.glob("bert_lightning_tokenizers/*"))  # the tokenizer trained on it
    assert not list(cache.glob("tokens-*"))
    assert not (out / "tokenizer.json").exists()
