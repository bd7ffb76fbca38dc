import json

import datasets
import pytest
import torch

from bert_lightning.data import pipeline
from bert_lightning.data.corpus import BadRecordError, iter_documents
from bert_lightning.data.pretraining import PretrainDataModule
from helpers import data_module, write_corpus


def datamodule(tmp_path, tokenizer, **kw) -> PretrainDataModule:
    kw.setdefault("train_files", str(write_corpus(tmp_path / "corpus.jsonl", 40)))
    dm = data_module(
        val_docs=5,
        max_seq_length=32,
        batch_size=4,
        cache_dir=str(tmp_path / "cache"),
        given_tokenizer=tokenizer,
        **kw,
    )
    dm.setup()
    return dm


def test_packed_blocks_are_full_and_framed(tmp_path, tiny_tokenizer):
    dm = datamodule(tmp_path, tiny_tokenizer)
    lengths = {len(r["input_ids"]) for r in dm.train_set}
    assert lengths == {32}
    for row in dm.train_set.select(range(10)):
        ids = row["input_ids"]
        assert ids[0] == 2 and ids[-1] == 3  # [CLS] ... [SEP]
        assert 0 not in ids and 2 not in ids[1:-1]  # no padding, one frame per block
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32) and "attention_mask" not in batch


def test_packing_keeps_the_token_stream(tmp_path, tiny_tokenizer):
    """Packed blocks, unframed and joined, are the documents' tokens in order (one map batch)."""
    dm = datamodule(tmp_path, tiny_tokenizer, val_files=str(tmp_path / "corpus.jsonl"))
    docs = list(iter_documents([str(tmp_path / "corpus.jsonl")]))
    stream = [t for e in tiny_tokenizer.encode_batch(docs, add_special_tokens=False) for t in e.ids]
    packed = [t for r in dm.train_set for t in r["input_ids"][1:-1]]
    assert packed == stream[: len(packed)] and len(stream) - len(packed) < 30


def test_isolated_packing_frames_each_document_and_restarts_positions(tmp_path, tiny_tokenizer):
    """Documents framed [CLS] ... [SEP], joined and cut into full blocks; the batch's
    position_ids restart at every [CLS] and at each block's start."""
    corpus = str(tmp_path / "corpus.jsonl")
    dm = datamodule(tmp_path, tiny_tokenizer, packing="packed_isolated", val_files=corpus)
    docs = list(iter_documents([corpus]))
    encoded = tiny_tokenizer.encode_batch(docs, add_special_tokens=False)
    stream = [t for e in encoded for t in (2, *e.ids, 3)]
    packed = [t for r in dm.train_set for t in r["input_ids"]]
    assert {len(r["input_ids"]) for r in dm.train_set} == {32}
    assert packed == stream[: len(packed)] and len(stream) - len(packed) < 32
    joins = [r for r in dm.train_set if 2 in r["input_ids"][1:]][:4]  # a document starts inside
    assert len(joins) == 4
    batch = dm.collator()(joins)
    ids, pos = batch["input_ids"], batch["position_ids"]  # (4, 32)
    assert "attention_mask" not in batch and pos.shape == ids.shape
    for row_ids, row_pos in zip(ids.tolist(), pos.tolist(), strict=True):
        expected, p = [], -1
        for i, t in enumerate(row_ids):
            p = 0 if t == 2 or i == 0 else p + 1
            expected.append(p)
        assert row_pos == expected


def test_isolated_packing_needs_the_arrow_cache(tmp_path):
    corpus = str(write_corpus(tmp_path / "c.jsonl", 3))
    with pytest.raises(ValueError, match="^data.packing=packed_isolated needs data.cache_format"):
        data_module(
            train_files=corpus, val_files=corpus, cache_format="tokens", packing="packed_isolated"
        )


def test_per_document_examples_pad_per_batch(tmp_path, tiny_tokenizer):
    corpus = write_corpus(tmp_path / "docs.jsonl", 40)
    with open(corpus, "a") as f:  # documents shorter than a block, so that a batch pads
        for n in (1, 2, 3, 4):
            f.write(json.dumps({"text": " ".join(["the cat sat on the mat"] * n)}) + "\n")
    dm = datamodule(tmp_path, tiny_tokenizer, packing="document", train_files=str(corpus))
    assert len(dm.train_set) == 39  # one example per training document
    assert all(len(r["input_ids"]) <= 32 for r in dm.train_set)
    rows = sorted(dm.train_set, key=lambda r: len(r["input_ids"]))[:4]
    lengths = [len(r["input_ids"]) for r in rows]
    assert len(set(lengths)) > 1  # some padded, some not
    batch = dm.collator()(rows)
    mask = batch["attention_mask"]
    assert mask.sum(1).tolist() == lengths
    assert torch.all(batch["input_ids"][mask == 0] == 0)
    assert batch["input_ids"].shape[1] == max(lengths) == int(mask.sum(1).max())
    full = dm.collator()(sorted(dm.train_set, key=lambda r: len(r["input_ids"]))[-4:])
    assert full["input_ids"].shape == (4, 32)  # nothing padded, and still a mask: the data pad
    assert full["attention_mask"].all()  # (packing=document), whether a batch needs it or not


def test_validation_holds_out_whole_documents(tmp_path, tiny_tokenizer):
    dm = datamodule(tmp_path, tiny_tokenizer, packing="document")
    train = {tuple(r["input_ids"]) for r in dm.train_set}
    val_labels = [r["labels"] for r in dm.val_set]
    assert len(dm.val_set) == 5
    # the validation set is masked once, with a fixed seed: same labels on a rebuild
    again = datamodule(tmp_path / "again", tiny_tokenizer, packing="document")
    assert [r["labels"] for r in again.val_set] == val_labels
    restored = [
        [lab if lab != -100 else i for i, lab in zip(r["input_ids"], r["labels"], strict=True)]
        for r in dm.val_set
    ]
    assert not train & {tuple(r) for r in restored}


def test_the_stages_compose_to_the_datamodule_sets(tmp_path, tiny_tokenizer):
    """read -> hold out -> tokenize -> frame (-> mask once), called one by one, give the sets."""
    dm = datamodule(tmp_path, tiny_tokenizer)
    docs = pipeline.read_documents(dm.train_files, dm.read_options(), str(tmp_path / "again"))
    train_docs, val_docs = pipeline.hold_out(docs, 5, dm.seed)
    tokens = pipeline.tokenize(train_docs, tiny_tokenizer)
    assert len(tokens) == 35 and tokens.column_names == ["input_ids"]
    train = pipeline.frame(tokens, pipeline.framing(tiny_tokenizer, "packed", 32))
    assert train["input_ids"] == dm.train_set["input_ids"]
    val = pipeline.mlm_examples(val_docs, tiny_tokenizer, "packed", 32)
    assert pipeline.mask_once(val, dm.collator(), dm.seed)["labels"] == dm.val_set["labels"]
    with pytest.raises(ValueError, match="40 documents in .*: too few to hold out"):
        pipeline.hold_out(docs, 40, dm.seed)


def test_processes_give_the_documents_order_of_one(tmp_path, tiny_tokenizer):
    """Tokenizing in 2 processes (each every other document, so that long documents at the
    files' end are shared) gives one process's rows, in the documents' order."""
    texts = [
        f"document {i} " + "word " * (i % 7 + (300 if i > 9_990 else 1)) for i in range(10_003)
    ]
    docs = datasets.Dataset.from_dict({"text": texts})
    one = pipeline.tokenize(docs, tiny_tokenizer)
    two = pipeline.tokenize(docs, tiny_tokenizer, num_proc=2)
    assert two["input_ids"] == one["input_ids"] and len(one) == 10_003
    assert pipeline.strided(7, 2).tolist() == [0, 2, 4, 6, 1, 3, 5]


def test_empty_corpus_and_bad_records(tmp_path, tiny_tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="no documents with text in .*empty.jsonl"):
        datamodule(tmp_path, tiny_tokenizer, train_files=str(empty))
    bad = write_corpus(tmp_path / "bad.jsonl", 30)
    with open(bad, "a") as f:
        f.write("{not json\n")
    with pytest.raises(BadRecordError, match=r"bad\.jsonl:31:\d+: invalid JSON"):
        datamodule(tmp_path, tiny_tokenizer, train_files=str(bad))
    dm = datamodule(tmp_path, tiny_tokenizer, train_files=str(bad), on_bad_record="skip")
    assert len(dm.train_set) > 0


def test_config_errors_are_named(tmp_path):
    with pytest.raises(ValueError, match="data.packing"):
        data_module(train_files=str(write_corpus(tmp_path / "c.jsonl", 3)), packing="x")
    with pytest.raises(ValueError, match="masking.p_mask"):
        data_module(
            train_files=str(tmp_path / "c.jsonl"), masking={"p_mask": 0.95, "p_random": 0.1}
        )


def test_data_is_built_once_per_run(tmp_path, monkeypatch):
    """validate-then-fit calls prepare_data and setup twice each: the sets are built once, and
    each document set (training, held out) is tokenized once."""
    from bert_lightning.config import compose
    from bert_lightning.data import pipeline
    from bert_lightning.training.pretrain import train
    from helpers import tiny_overrides

    calls = []

    def counted(name, fn):
        return lambda *a, **kw: calls.append(name) or fn(*a, **kw)

    monkeypatch.setattr(PretrainDataModule, "build", counted("build", PretrainDataModule.build))
    monkeypatch.setattr(pipeline, "tokenize", counted("tokenize", pipeline.tokenize))
    write_corpus(tmp_path / "corpus.jsonl")
    overrides = tiny_overrides(tmp_path, "validate_before_fit=true", "trainer.max_steps=2")
    train(compose(overrides=overrides))
    assert calls == ["build", "tokenize", "tokenize"]


@pytest.mark.parametrize("long_doc", [False, True])
def test_holding_out_documents_says_the_share_of_text_it_takes(caplog, long_doc):
    """A document may be a book: what the held-out documents take from training is said (by
    a count of characters by hand), as a warning past a tenth of the text."""
    import datasets

    def docs_of(texts):
        n = len(texts)
        return datasets.Dataset.from_dict({"text": texts, "file": [0] * n, "doc": list(range(n))})

    texts = ["word " * 20] * 20
    _, val = pipeline.hold_out(docs_of(texts), 2, seed=0)  # which ones the seed holds out
    if long_doc:
        texts[val["doc"][0]] = "word " * 5000
    caplog.clear()
    with caplog.at_level("INFO", logger="bert_lightning.data.pipeline"):
        _, val = pipeline.hold_out(docs_of(texts), 2, seed=0)
    share = sum(map(len, val["text"])) / sum(map(len, texts))
    (record,) = [r for r in caplog.records if "holds out" in r.getMessage()]
    assert record.getMessage().startswith(
        f"data.val_docs=2 holds out 2 of 20 documents, {100 * share:.1f}% of the text, from "
        "training"
    )
    assert (record.levelname == "WARNING") == long_doc == (share > 0.1)


def test_a_new_run_in_a_used_folder_trains_its_own_tokenizer(tmp_path, tiny_tokenizer, monkeypatch):
    """A `tokenizer.json` already in the run folder (an earlier run's, of other files or
    settings) is replaced by the one this run trains; only a DDP rank other than 0 reads the
    file, rank 0's of the same run."""
    from lightning.pytorch.utilities import rank_zero_only

    from bert_lightning.data.tokenizer import load_tokenizer, save_tokenizer

    save_tokenizer(tiny_tokenizer, tmp_path / "run" / "tokenizer.json")
    kw = dict(
        train_files=str(write_corpus(tmp_path / "c.jsonl", 40)), out_dir=str(tmp_path / "run")
    )
    kw |= dict(cache_dir=str(tmp_path / "cache"), tokenizer={"vocab_size": 150}, val_docs=5)
    trained = data_module(**kw).build_tokenizer()
    assert trained.get_vocab_size() != tiny_tokenizer.get_vocab_size()
    assert load_tokenizer(tmp_path / "run" / "tokenizer.json").to_str() == trained.to_str()
    save_tokenizer(tiny_tokenizer, tmp_path / "run" / "tokenizer.json")  # as rank 0 saved it
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert data_module(**kw).build_tokenizer().to_str() == tiny_tokenizer.to_str()
