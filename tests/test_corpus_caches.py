"""A corpus's first run shows its progress and caches its tokenizer; a second run on the same
files and settings reuses it (and so the packed blocks) instead of training it again; a changed
file or setting trains a new one; validation is bounded to `data.max_eval_samples` examples
spread over every validation file."""

import json
import logging
import math
import os
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch

from bert_lightning.config import compose
from bert_lightning.data import pipeline, prepare, pretraining
from bert_lightning.data.prepare import cache_folder
from bert_lightning.data.tokenizer import train_wordpiece
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import fingerprint
from bert_lightning.training.instantiate import instantiate
from bert_lightning.training.pretrain import build, train
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


def test_a_second_run_reuses_the_tokenizer_and_lines_show_the_progress(tmp_path, caplog):
    corpus, cache = write_corpus(tmp_path / "corpus.jsonl", 60), tmp_path / "cache"

    def run(name: str) -> str:
        caplog.clear()
        extra = [f"data.train_files={corpus}", f"data.cache_dir={cache}"]
        extra += ["callbacks.progress_bar.seconds=0"]  # a line at every count, off a terminal
        extra += ["data.max_eval_samples=3", "data.val_docs=10"]
        with caplog.at_level(logging.INFO):
            train(compose(overrides=tiny_overrides(tmp_path / name, *extra)))
        return caplog.text

    first = run("first")
    assert "trained a WordPiece vocabulary" in first
    # pass 1 counts the documents (at most data.tokenizer.max_docs): pass 2 knows the total
    assert "tokenizer, pass 1 of 2: 1 documents" in first
    assert "tokenizer, pass 2 of 2: 1 of 50 documents" in first
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


def lines(path, texts):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def book(i: int, pieces: int = 5, chars: int = 300) -> str:
    """A document of `pieces` paragraphs just under `chars` characters, each naming its book."""
    para = (f"book{i} " * chars)[: chars - 10].strip()
    return "\n\n".join([para] * pieces)


def tokens_module(tmp_path, train, tok, **values):
    val = str(write_corpus(tmp_path / "val.jsonl", 5))
    kw = dict(val_files=val, max_seq_length=32, cache_format="tokens", given_tokenizer=tok)
    return data_module(
        "corpus", train_files=train, cache_dir=str(tmp_path / "cache"), **kw | values
    )


def blocks_of(dm) -> list[list[int]]:
    dm.setup()
    return [dm.train_set[i]["input_ids"] for i in range(len(dm.train_set))]


def test_two_files_of_one_name_and_an_edited_file_are_tokenized_apart(tmp_path, tiny_tokenizer):
    a = write_corpus(tmp_path / "a" / "train.jsonl", 30)
    b = lines(tmp_path / "b" / "train.jsonl", [f"other text number {i} " * 20 for i in range(30)])
    both = blocks_of(tokens_module(tmp_path, [str(a), b], tiny_tokenizer))
    only_a = blocks_of(tokens_module(tmp_path / "fresh_a", [str(a)], tiny_tokenizer))
    only_b = blocks_of(tokens_module(tmp_path / "fresh_b", [b], tiny_tokenizer))
    assert both == only_a + only_b  # b's own tokens follow a's, not a's again
    lines(tmp_path / "b" / "train.jsonl", ["edited " * 40] * 30)  # the same file, edited
    again = blocks_of(tokens_module(tmp_path, [b], tiny_tokenizer))
    assert again == blocks_of(tokens_module(tmp_path / "fresh_edit", [b], tiny_tokenizer))
    assert again != only_b


@pytest.mark.parametrize(
    "first, second",
    [
        ({"max_doc_chars": 100_000}, {"max_doc_chars": 300}),
        ({"max_doc_chars": 300, "long_docs": "error", "on_bad_record": "skip"}, {}),
        ({"text_unit": "block"}, {"text_unit": "line"}),
    ],
)
def test_the_tokens_cache_is_keyed_by_how_files_are_read(tmp_path, tiny_tokenizer, first, second):
    docs = [book(i) for i in range(20)]
    corpus = lines(tmp_path / "books.jsonl", docs)
    text = tmp_path / "books.txt"
    text.write_text("\n\n".join(d.replace("\n\n", "\n") for d in docs) + "\n")
    train = str(text) if "text_unit" in first else corpus
    split = {"long_docs": "split", "max_doc_chars": 100_000, "packing": "document"}
    tokens_module(tmp_path, train, tiny_tokenizer, **split | first).setup()
    cached = blocks_of(tokens_module(tmp_path, train, tiny_tokenizer, **split | second))
    fresh = blocks_of(tokens_module(tmp_path / "fresh", train, tiny_tokenizer, **split | second))
    assert cached == fresh


def test_a_held_out_book_has_no_piece_in_training_nor_in_the_tokenizer(tmp_path):
    corpus = lines(tmp_path / "books.jsonl", [book(i) for i in range(20)])
    dm = data_module(
        "corpus",
        train_files=corpus,
        val_docs=5,
        max_doc_chars=300,  # each book: 5 pieces
        cache_dir=str(tmp_path / "cache"),
        tokenizer=TOKENIZER,
    )
    docs = pipeline.read_documents(dm.train_files, dm.read_options(), dm.cache_dir)
    train, val = pipeline.hold_out(docs, dm.val_docs, dm.seed)
    assert (len(train), len(val)) == (75, 25)
    named = lambda texts: {t.split()[0] for t in texts}
    held = named(val["text"])
    assert len(held) == 5 and not held & named(train["text"])
    assert not held & named(dm.tokenizer_documents())  # what the tokenizer is trained on


def test_the_draw_is_train_test_splits_when_no_document_is_cut(tmp_path):
    """The default run's validation documents stay those of `train_test_split`."""
    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    dm = data_module("corpus", train_files=str(corpus), val_docs=5, cache_dir=str(tmp_path))
    train, val = dm.documents()
    split = dm.read(dm.train_files).train_test_split(test_size=5, seed=dm.seed)
    assert list(train["text"]) == list(split["train"]["text"])
    assert list(val["text"]) == list(split["test"]["text"])


def test_the_tokenizer_reads_the_training_files_interleaved(tmp_path):
    """With documents held out, the tokenizer's stream is still the files in turn (the
    first document of each, then the second, ...), less the held-out ones."""
    a = lines(tmp_path / "a.jsonl", [f"alpha{i} text" for i in range(6)])
    b = lines(tmp_path / "b.jsonl", [f"beta{i} text" for i in range(3)])
    dm = data_module("corpus", train_files=[a, b], val_docs=2, cache_dir=str(tmp_path))
    held = set(dm.documents()[1]["text"])
    order = ["alpha0", "beta0", "alpha1", "beta1", "alpha2", "beta2", "alpha3", "alpha4"]
    expected = [f"{w} text" for w in [*order, "alpha5"] if f"{w} text" not in held]
    assert list(dm.tokenizer_documents()) == expected


@pytest.mark.parametrize(
    "override",
    [
        "data.train_files=c.jsonl",
        "data.val_files=c.jsonl",
        "data.cache_format=tokens",
        "data.cache_dir=cache",
        "data.long_docs=split",
        "data.text_unit=line",
    ],
)
def test_a_stream_refuses_the_options_it_would_ignore(override):
    cfg = compose(overrides=["data=c4_hub", override])
    key, value = override.split("=")
    with pytest.raises(UserError, match=f"^{key}='?{value}'?"):
        instantiate(cfg.data, "data", out_dir=None)


@pytest.mark.parametrize("packing", ["packed", "packed_isolated"])
def test_nsp_refuses_a_packing_it_would_ignore(packing):
    with pytest.raises(UserError, match=f"^data.packing='{packing}': NSP examples are sentence"):
        data_module("c4_nsp", packing=packing)


def test_a_stream_of_files_reads_them_with_our_reader(tmp_path, tiny_tokenizer):
    train = write_corpus(tmp_path / "t.jsonl", 30)
    cfg = compose(
        overrides=[
            "data=c4_hub",
            "data.path=files",
            "data.name=null",
            f"+data.data_files.train={train}",
            f"+data.data_files.validation={train}",
            "data.text_unit=line",  # our reader's option: taken
            "data.max_seq_length=32",
        ]
    )
    dm = instantiate(cfg.data, "data", out_dir=None)
    dm.build_tokenizer(tiny_tokenizer)
    dm.setup()
    assert len(dm.val_set) > 0 and dm.data_record()["data.text_unit"] == "line"


def stamp_changes(path):
    """A change of one character, and of its modification time (the size stays)."""

    def edit():
        text = path.read_text()
        path.write_text(text.replace("o", "0", 1))
        os.utime(path, ns=(1, os.stat(path).st_mtime_ns + 10**9))

    return edit


@pytest.mark.parametrize(
    "change",
    [
        "file",
        "on_bad_record",
        "max_doc_chars",
        "long_docs",
        "text_unit",
        "val_docs",
        "seed",
        "vocab_size",
        "min_frequency",
        "max_docs",
    ],
)
def test_the_tokenizer_cache_misses_when_any_input_changes(tmp_path, change):
    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    base = dict(train_files=str(corpus), cache_dir=str(tmp_path / "cache"), tokenizer=TOKENIZER)
    key = data_module("corpus", **base).tokenizer_key()
    assert data_module("corpus", **base).tokenizer_key() == key  # the same inputs: a hit
    changed = {
        "on_bad_record": {"on_bad_record": "skip"},
        "max_doc_chars": {"max_doc_chars": 5000},
        "long_docs": {"long_docs": "error"},
        "text_unit": {"text_unit": "line"},
        "val_docs": {"val_docs": 7},
        "seed": {"seed": 1},
        "vocab_size": {"tokenizer": TOKENIZER | {"vocab_size": 280}},
        "min_frequency": {"tokenizer": TOKENIZER | {"min_frequency": 2}},
        "max_docs": {"tokenizer": TOKENIZER | {"max_docs": 30}},
    }
    if change == "file":
        stamp_changes(corpus)()
    assert data_module("corpus", **base | changed.get(change, {})).tokenizer_key() != key


def test_the_tokens_cache_misses_for_another_tokenizer(tmp_path, tiny_tokenizer):
    docs = [f"text {i} " * 30 for i in range(30)]
    other = train_wordpiece(lambda: iter(docs), vocab_size=300)
    assert cache_folder(tmp_path, other) != cache_folder(tmp_path, tiny_tokenizer)
    corpus = lines(tmp_path / "c.jsonl", docs)
    mine = blocks_of(tokens_module(tmp_path, corpus, tiny_tokenizer))
    theirs = blocks_of(tokens_module(tmp_path, corpus, other))
    assert theirs == blocks_of(tokens_module(tmp_path / "fresh", corpus, other)) != mine


@pytest.mark.parametrize("change", ["file", "max_doc_chars", "long_docs", "text_unit"])
def test_the_arrow_documents_cache_misses_when_any_input_changes(tmp_path, change):
    corpus = tmp_path / "books.txt"  # a book a block, a paragraph a line
    corpus.write_text("\n\n".join(book(i, 1 + i % 3).replace("\n\n", "\n") for i in range(9)))
    base = dict(
        train_files=str(corpus), cache_dir=str(tmp_path / "c"), val_docs=2, long_docs="split"
    )
    before = data_module("corpus", **base).documents()[0]
    changed = {
        "max_doc_chars": {"max_doc_chars": 300},
        "long_docs": {"long_docs": "error", "on_bad_record": "skip", "max_doc_chars": 500},
        "text_unit": {"text_unit": "line"},
    }.get(change, {})
    if change == "file":
        stamp_changes(corpus)()
    cached = data_module("corpus", **base | changed).documents()[0]
    fresh = data_module("corpus", **base | changed | {"cache_dir": str(tmp_path / "fresh")})
    assert list(cached["text"]) == list(fresh.documents()[0]["text"]) != list(before["text"])


def test_the_data_record_names_each_part_a_run_depends_on(tmp_path, tiny_tokenizer):
    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    dm = data_module("corpus", train_files=str(corpus), given_tokenizer=tiny_tokenizer)
    record = dm.data_record()
    assert json.loads(json.dumps(record)) == record  # plain values, stored as they are
    ((path, size, mtime),) = record["data.train_files"]
    assert (path, size) == (str(corpus.resolve()), corpus.stat().st_size)
    assert record["data.val_docs"] == 50 and record["data.seed"] == dm.seed
    assert record["data.long_docs"] == "split" and np.isfinite(mtime)


@pytest.mark.parametrize(
    "option, change",
    [
        ("corpus", {"packing": "document"}),
        ("corpus", {"max_seq_length": 24}),
        ("corpus", {"masking": {"mlm_probability": 0.3}}),
        ("corpus", {"seed": 7}),
        ("corpus", {"tokenizer": "other"}),
        ("c4_nsp", {"short_seq_prob": 0.9}),
        ("c4_nsp", {"dupe_factor": 2}),
        ("c4_nsp", {"seed": 7}),
    ],
)
def test_the_arrow_examples_cache_misses_when_any_input_changes(
    tmp_path, tiny_tokenizer, option, change
):
    """Token ids, examples (MLM blocks, NSP pairs) and validation masks on one cache folder: a
    changed tokenizer, framing, pairing, masking or seed gives the sets a fresh cache gives."""
    corpus = str(write_corpus(tmp_path / "c.jsonl", 40))
    other = train_wordpiece(lambda: iter([f"text {i} " * 30 for i in range(30)]), vocab_size=300)
    base = dict(train_files=corpus, val_docs=5, max_seq_length=32, given_tokenizer=tiny_tokenizer)
    if change.get("tokenizer"):
        change = {"given_tokenizer": other}

    def sets(values, cache):
        dm = data_module(option, **values, cache_dir=str(tmp_path / cache))
        dm.setup()
        return dm.train_set[:]["input_ids"], dm.val_set[:]["labels"]

    before = sets(base, "cache")
    assert sets(base | change, "cache") == sets(base | change, "fresh") != before


@pytest.mark.parametrize("option", [[], ["data=c4_nsp"], ["objective=rtd"]])
def test_validation_losses_do_not_depend_on_how_rows_are_batched(tmp_path, option):
    """`val/loss` and its terms are means over the items each term averages (masked tokens,
    pairs, positions) over the whole set: the same at any batch size, equal to the sum over
    single rows, and (MLM) the log of the perplexity over the same tokens."""
    write_corpus(tmp_path / "corpus.jsonl", 40)
    cfg = compose(overrides=tiny_overrides(tmp_path, *option, "data.val_docs=8"))
    dm, module, trainer = build(cfg)
    got = {}
    for size in (1, 3, 64):
        dm.batch_size = size
        got[size] = trainer.validate(module, datamodule=dm, verbose=False)[0]
    if option == ["objective=rtd"]:  # the generator's draws are seeded by validation batch
        got = {size: {"val/gen_mlm_loss": m["val/gen_mlm_loss"]} for size, m in got.items()}
    assert got[3] == pytest.approx(got[1], rel=1e-5) and got[64] == pytest.approx(got[1], rel=1e-5)
    module.eval()
    sums: dict[str, list[float]] = {}
    with torch.no_grad():
        for row in dm.val_set:
            batch = dm.collator()([{k: row[k] for k in row}])
            out = module(batch)
            if option == ["objective=rtd"]:
                terms = {"mlm": (out.gen_loss, int((out.gen_labels != -100).sum()))}
            else:
                terms = {"mlm": (out.mlm_loss, int((out.mlm_labels != -100).sum()))}
            if option == ["data=c4_nsp"]:
                terms["nsp"] = (out.nsp_loss, 1)
            for k, (loss, n) in terms.items():
                total, count = sums.setdefault(k, [0.0, 0])
                sums[k] = [total + float(loss) * n if n else total, count + n]
    mlm = sums["mlm"][0] / sums["mlm"][1]
    if option == ["data=c4_nsp"]:
        nsp = sums["nsp"][0] / sums["nsp"][1]
        assert got[1]["val/mlm_loss"] == pytest.approx(mlm, rel=1e-5)
        assert got[1]["val/loss"] == pytest.approx(mlm + nsp, rel=1e-5)
    elif option == ["objective=rtd"]:
        assert got[1]["val/gen_mlm_loss"] == pytest.approx(mlm, rel=1e-5)
    else:
        assert got[1]["val/loss"] == pytest.approx(mlm, rel=1e-5)
        assert math.exp(got[1]["val/loss"]) == pytest.approx(got[1]["val/ppl"], rel=1e-4)


def test_every_data_cache_is_keyed_by_the_data_code(tmp_path, tiny_tokenizer, monkeypatch):
    """Another version of the code that reads, tokenizes, frames or masks (another `CODE`: the
    data layer's source and the tokenizers release) misses the documents, examples, token
    arrays and tokenizer cached by this one."""
    data_code = sorted(Path(pipeline.__file__).parent.glob("*.py"))
    want = fingerprint(tokenizers.__version__, *(p.read_bytes() for p in data_code))
    assert pipeline.CODE == prepare.CODE == pretraining.CODE == want
    corpus = str(write_corpus(tmp_path / "c.jsonl", 40))
    dm = data_module("corpus", train_files=corpus, val_docs=5, cache_dir=str(tmp_path))

    def keys():
        docs = pipeline.read_documents(dm.train_files, dm.read_options(), dm.cache_dir)
        return docs._fingerprint, prepare.shard_paths(tmp_path, corpus, {}), dm.tokenizer_key()

    before = keys()
    assert keys() == before
    for module in (pipeline, prepare, pretraining):
        monkeypatch.setattr(module, "CODE", "another version")
    assert all(a != b for a, b in zip(keys(), before, strict=True))
