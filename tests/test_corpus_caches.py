"""A corpus's first run shows its progress and caches its tokenizer; a second run on the same
files and settings reuses it (and so the packed blocks) instead of training it again; a changed
file or setting trains a new one; validation is bounded to `data.max_eval_samples` examples
spread over every validation file."""

import json
import logging

import pytest

from bert_lightning import progress
from bert_lightning.config import compose
from bert_lightning.training.pretrain import train
from helpers import data_module, tiny_overrides, write_corpus

TOKENIZER = {"vocab_size": 300, "min_frequency": 1, "max_docs": None}


def tokenizer_of(corpus, cache, caplog, **tokenizer):
    """(the trained or cached tokenizer of `corpus`, what the data module logged for it)"""
    caplog.clear()
    dm = data_module(
        "corpus",
        train_files=str(corpus),
        cache_dir=str(cache),
        val_docs=5,
        tokenizer=TOKENIZER | tokenizer,
    )
    with caplog.at_level(logging.INFO):
        tok = dm.build_tokenizer()
    return tok, caplog.text


def test_the_tokenizer_is_cached_by_files_and_settings(tmp_path, caplog):
    corpus, cache = write_corpus(tmp_path / "corpus.jsonl", 40), tmp_path / "cache"
    first, log = tokenizer_of(corpus, cache, caplog)
    assert "trained a WordPiece vocabulary" in log and "tokenizer: cached as" in log
    second, log = tokenizer_of(corpus, cache, caplog)
    assert "trained before on the same files and settings" in log
    assert "trained a WordPiece" not in log and second.to_str() == first.to_str()
    _, log = tokenizer_of(corpus, cache, caplog, vocab_size=280)  # another setting
    assert "trained a WordPiece vocabulary" in log
    with open(corpus, "a") as f:  # a changed file
        f.write(json.dumps({"text": "zyzzyva " * 30}) + "\n")
    _, log = tokenizer_of(corpus, cache, caplog)
    assert "trained a WordPiece vocabulary" in log
    assert len(list((cache / "bert_lightning_tokenizers").glob("wordpiece-*.json"))) == 3


def test_a_second_run_reuses_the_tokenizer_and_lines_show_the_progress(
    tmp_path, caplog, monkeypatch
):
    monkeypatch.setattr(progress, "SECONDS", 0.0)  # a line at every count, off a terminal
    corpus, cache = write_corpus(tmp_path / "corpus.jsonl", 60), tmp_path / "cache"

    def run(name: str) -> str:
        caplog.clear()
        extra = [f"data.train_files={corpus}", f"data.cache_dir={cache}"]
        extra += ["data.max_eval_samples=3", "data.val_docs=10"]
        with caplog.at_level(logging.INFO):
            train(compose(overrides=tiny_overrides(tmp_path / name, *extra)))
        return caplog.text

    first = run("first")
    assert "trained a WordPiece vocabulary" in first
    for line in ("tokenizer, pass 1 of 2: 1 of", "tokenizer, pass 2 of 2: 1 of 50 documents"):
        assert line in first
    assert "reading 1 files: " in first and "tokenizing: " in first and "framing: " in first
    assert "validating on 3 of " in first
    second = run("second")
    assert "trained before on the same files and settings" in second
    assert "trained a WordPiece" not in second and "tokenizing: " not in second  # cached blocks
    assert "validating on 3 of " in second


def test_validation_is_bounded_evenly_over_every_file(tmp_path):
    cats, dogs = tmp_path / "cats.jsonl", tmp_path / "dogs.jsonl"
    for path, word in ((cats, "cat"), (dogs, "dog")):
        path.write_text("".join(json.dumps({"text": f"{word} " * 200}) + "\n" for _ in range(5)))
    train = write_corpus(tmp_path / "corpus.jsonl", 30)

    def val_set(n):
        dm = data_module(
            "corpus",
            train_files=str(train),
            val_files=[str(cats), str(dogs)],
            cache_dir=str(tmp_path / "cache"),
            max_eval_samples=n,
            max_seq_length=32,
            tokenizer=TOKENIZER,
        )
        dm.setup()
        return dm.val_set, dm.tokenizer

    everything, tok = val_set(None)
    bounded, _ = val_set(4)
    assert len(everything) > 8 and len(bounded) == 4
    words = [set(tok.decode(ids).split()) for ids in bounded["input_ids"]]
    assert {"cat"} <= set.union(*words[:2]) and {"dog"} <= set.union(*words[2:])
    with pytest.raises(Exception, match=r"data.max_eval_samples=0; expected >= 1 or null"):
        val_set(0)
