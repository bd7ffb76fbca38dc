"""`data=corpus`: a user's own files, JSON lines and text mixed, several sources at once, a book
over `max_doc_chars` split into pieces, and the tokenizer drawn from every file."""

import csv
import gzip
import json
import math

import pytest
from hydra.utils import instantiate

from bert_lightning.commands.evaluate import evaluate_mlm
from bert_lightning.config import compose
from bert_lightning.data.corpus import BadRecordError, iter_documents
from bert_lightning.data.tokenizer import train_wordpiece
from bert_lightning.training.pretrain import train
from helpers import SAMPLE, data_module, tiny_overrides

TOKENIZER = {"vocab_size": 200, "min_frequency": 1, "max_docs": 2}


def test_the_tokenizer_trains_on_every_file_not_only_the_first(tmp_path):
    wiki = tmp_path / "wiki.jsonl"
    wiki.write_text(
        "".join(json.dumps({"text": f"the cat sat on mat {i}"}) + "\n" for i in range(3))
    )
    books = tmp_path / "books.txt"
    books.write_text("zyzzyva " * 20 + "\n")
    files = [str(wiki), str(books)]
    dm = data_module("corpus", train_files=files, val_files=str(wiki), tokenizer=TOKENIZER)
    assert "zyzzyva" in dm.build_tokenizer().get_vocab()
    sequential = train_wordpiece(lambda: iter_documents(files), **TOKENIZER)  # the files in turn
    assert "zyzzyva" not in sequential.get_vocab()  # max_docs=2: both from wiki.jsonl


def test_data_corpus_trains_on_mixed_files_and_a_split_book(tmp_path):
    docs = list(iter_documents([SAMPLE]))
    wiki = tmp_path / "wikipedia-train-00000.jsonl.gz"
    wiki.write_bytes(
        gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in docs[:30]).encode())
    )
    notes = tmp_path / "notes.txt"
    notes.write_text("\n\n".join(" ".join(t.split()) for t in docs[30:40]) + "\n")
    book = "\n\n".join(docs[40:70]) + "\n\nThe end of the book."
    books = tmp_path / "books-train-00000.jsonl"
    books.write_text(json.dumps({"text": book}) + "\n")
    files = ",".join(map(str, (wiki, notes, books)))

    def config(out, *extra):
        data = ["data=corpus", f"data.train_files=[{files}]", "data.max_doc_chars=5000"]
        return compose(overrides=tiny_overrides(out, *data, "validate_before_fit=false", *extra))

    over = r"train-00000\.jsonl(\.gz)?:\d+: document of [\d,]+ characters, over max_doc_chars=5,000"
    with pytest.raises(BadRecordError, match=over):
        train(config(tmp_path / "refused", "data.long_docs=error"))  # _corpus.yaml's default
    cfg = config(tmp_path)
    assert cfg.data.long_docs == "split" and len(book) > 5000
    read = instantiate(cfg.data, out_dir=None).read([str(books)])["text"]
    assert len(read) > len(book) // 5000 and max(map(len, read)) <= 5000
    assert " ".join(read).split() == book.split()  # every word of the book, in order
    val_loss = train(cfg)
    with open(tmp_path / "metrics.csv") as f:
        losses = [float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]]
    assert len(losses) == cfg.trainer.max_steps and all(map(math.isfinite, losses))
    assert val_loss is not None and math.isfinite(val_loss)
    # evaluate reads a held-out book as the run read its documents: over the default limit of
    # 1,000,000 characters, split, not refused
    long_book = tmp_path / "books-validation-00000.jsonl"
    long_book.write_text(json.dumps({"text": "\n\n".join([book] * (1 + 10**6 // len(book)))}))
    held_out = evaluate_mlm(tmp_path / "checkpoints/last.ckpt", [str(long_book)], batch_size=256)
    assert held_out["examples"] > 0 and math.isfinite(held_out["loss"])
