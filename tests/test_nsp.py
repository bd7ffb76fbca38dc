import random

import pytest
import torch

from bert_lightning.data.masking import picked_positions
from bert_lightning.data.nsp import document_pairs, frame_pair, split_sentences
from helpers import OPTIM, TINY_BERT, data_module, write_corpus


def synthetic_documents(n_docs: int, seed: int = 0, sentences=(1, 12)) -> list[list[list[int]]]:
    """Token id = doc * 10,000 + position in the document: a pair's tokens tell which document
    and which place they come from."""
    rng = random.Random(seed)
    docs = []
    for d in range(n_docs):
        pos, doc = 0, []
        for _ in range(rng.randint(*sentences)):
            n = rng.randint(2, 25)
            doc.append(list(range(d * 10_000 + pos, d * 10_000 + pos + n)))
            pos += n
        docs.append(doc)
    return docs


def all_pairs(docs, max_seq_length, short_seq_prob=0.1):
    for i in range(len(docs)):
        for a, b, label, b_doc in document_pairs(
            docs, i, max_seq_length, short_seq_prob, random.Random(i)
        ):
            yield i, a, b, label, b_doc


@pytest.mark.parametrize("max_seq_length", [32, 128])
def test_pairs_follow_the_recipe(max_seq_length):
    docs = synthetic_documents(2000)
    pairs = list(all_pairs(docs, max_seq_length))[:2000]
    assert len(pairs) == 2000
    is_next = sum(label == 0 for *_, label, _ in pairs) / len(pairs)
    assert 0.47 <= is_next <= 0.53
    for doc, a, b, label, b_doc in pairs:
        assert a and b and len(a) + len(b) + 3 <= max_seq_length
        assert {t // 10_000 for t in a} == {doc}  # A: one run of its own document
        assert a == list(range(a[0], a[-1] + 1))  # consecutive
        b_docs = {t // 10_000 for t in b}
        if label == 1:  # NotNext: B from another document, never A's
            assert b_docs == {b_doc} and b_doc != doc
        else:  # IsNext: B continues A in the same document
            assert b_docs == {doc} and b[0] > a[-1]


def test_short_sequences_are_drawn():
    """The target length is drawn once per document (as the reference): long documents with
    short_seq_prob=0 give nearly only full pairs; with 0.5, about half the documents do not."""
    docs = synthetic_documents(200, sentences=(30, 40))

    def short_share(p):
        lengths = [len(a) + len(b) + 3 for _, a, b, _, _ in all_pairs(docs, 128, p)]
        return sum(n < 100 for n in lengths) / len(lengths)

    assert short_share(0.0) < 0.2 and short_share(0.5) > 0.5


def test_frame_pair_segment_ids():
    ids, types = frame_pair([7, 8], [9], cls_id=2, sep_id=3)
    assert ids == [2, 7, 8, 3, 9, 3] and types == [0, 0, 0, 0, 1, 1]


def test_split_sentences_keeps_abbreviations():
    text = "Voters on Nov. 8 approved it. The U.S. Army came.\n\nA new line! Another one?"
    assert split_sentences(text) == [
        "Voters on Nov. 8 approved it.",
        "The U.S. Army came.",
        "A new line!",
        "Another one?",
    ]


def nsp_datamodule(tmp_path, tokenizer, n_docs: int, val_docs: int, batch_size: int):
    """An NSPDataModule over the first `n_docs` sample documents, set up with `tokenizer`."""
    dm = data_module(
        "c4_nsp",
        train_files=str(write_corpus(tmp_path / "corpus.jsonl", n_docs)),
        val_docs=val_docs,
        max_seq_length=48,
        batch_size=batch_size,
        cache_dir=str(tmp_path / "cache"),
        given_tokenizer=tokenizer,
    )
    dm.setup()
    return dm


def test_nsp_datamodule_examples_and_batches(tmp_path, tiny_tokenizer):
    dm = nsp_datamodule(tmp_path, tiny_tokenizer, n_docs=60, val_docs=10, batch_size=8)
    cls_id, sep_id = tiny_tokenizer.token_to_id("[CLS]"), tiny_tokenizer.token_to_id("[SEP]")
    labels = []
    for row in dm.train_set:
        ids, types = row["input_ids"], row["token_type_ids"]
        assert len(ids) == len(types) <= 48 and ids[0] == cls_id and ids[-1] == sep_id
        first_sep = ids.index(sep_id)
        assert 1 < first_sep < len(ids) - 2 and ids.count(sep_id) == 2
        assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 1)
        labels.append(row["next_sentence_label"])
    assert len(labels) > 100 and 0.35 < sum(labels) / len(labels) < 0.65
    batch = next(iter(dm.train_dataloader()))
    assert batch["next_sentence_label"].shape == (8,)
    assert batch["token_type_ids"].shape == batch["input_ids"].shape
    assert (batch["labels"] != -100).any()
    if "attention_mask" in batch:  # padding is segment 0
        assert torch.all(batch["token_type_ids"][batch["attention_mask"] == 0] == 0)
    val = next(iter(dm.val_dataloader()))
    assert {"labels", "next_sentence_label", "token_type_ids"} <= set(val)


@pytest.mark.slow
def test_train_with_nsp_logs_nsp_metrics(tmp_path):
    import csv

    from bert_lightning.config import compose
    from bert_lightning.training.pretrain import train
    from helpers import tiny_overrides

    write_corpus(tmp_path / "corpus.jsonl", 60)
    val_loss = train(compose(overrides=tiny_overrides(tmp_path, "data=c4_nsp")))
    with open(tmp_path / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    val = [r for r in rows if r["val/nsp_acc"]]
    assert val and all(0.0 <= float(r["val/nsp_acc"]) <= 1.0 for r in val)
    assert any(r["train/nsp_loss"] for r in rows) and any(r["train/nsp_acc"] for r in rows)
    last = val[-1]  # loss = MLM + NSP
    total = float(last["val/mlm_loss"]) + float(last["val/nsp_loss"])
    assert val_loss == pytest.approx(total, rel=1e-4)


def test_objective_selects_the_nsp_loss():
    from bert_lightning.training.pretrain_module import BertPretrainModule

    config = dict(TINY_BERT, vocab_size=50, num_hidden_layers=1)
    labels = torch.randint(5, 50, (4, 10))
    batch = {
        "input_ids": torch.randint(5, 50, (4, 10)),
        "token_type_ids": torch.zeros(4, 10, dtype=torch.long),
        "labels": labels,
        "mlm_positions": picked_positions(labels),  # (B, T)
        "next_sentence_label": torch.tensor([0, 1, 0, 1]),
    }
    both = BertPretrainModule(config, OPTIM, nsp=True)
    out = both(batch)
    assert out.nsp_loss is not None and torch.allclose(out.loss, out.mlm_loss + out.nsp_loss)
    mlm = BertPretrainModule(config, OPTIM, nsp=False)
    assert mlm(batch).nsp_loss is None
    frozen = {n for n, p in mlm.named_parameters() if not p.requires_grad}
    assert frozen and all(".pooler." in n or "seq_relationship" in n for n in frozen)


def test_nsp_loss_falls_on_a_fixed_batch(tmp_path, tiny_tokenizer):
    """The NSP head and its gradient path learn: a fixed batch of pairs is memorised."""
    from bert_lightning.training.pretrain_module import BertPretrainModule

    dm = nsp_datamodule(tmp_path, tiny_tokenizer, n_docs=30, val_docs=5, batch_size=16)
    batch = next(iter(dm.train_dataloader()))
    config = dict(TINY_BERT, vocab_size=tiny_tokenizer.get_vocab_size())
    module = BertPretrainModule(config, OPTIM, nsp=True)
    opt = torch.optim.AdamW(module.parameters(), lr=3e-3)
    first = None
    for _ in range(80):
        out = module(batch)
        first = first if first is not None else float(out.nsp_loss)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    assert 0.6 < first < 0.8 and float(out.nsp_loss) < 0.1
