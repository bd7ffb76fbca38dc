"""The reproductions of issue #53's rows about resume and evaluate, kept so they stay fixed:
`bert-lightning evaluate` of a pretraining checkpoint scores the examples its run validated on
(row 4: how text files were read, NSP pairs and their loss), and `ckpt_path=` refuses other data
than the run's, or says what changed with `resume_with_new_data=true` (row 10)."""

import json

import pytest

from bert_lightning.cli import main
from bert_lightning.config import bundled, compose
from bert_lightning.data.corpus import iter_documents
from bert_lightning.training.pretrain import train
from helpers import tiny_overrides, write_corpus


def write_text_corpus(path, docs) -> str:
    """C4 documents as a .txt file: a block each (its paragraphs on lines of their own)."""
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def sample_docs(start: int, stop: int) -> list[str]:
    return list(iter_documents([bundled("c4_sample.jsonl")]))[start:stop]


def evaluated_loss(tmp_path, ckpt, val) -> dict:
    out = tmp_path / "eval.json"
    main(["evaluate", str(ckpt), str(val), "--cache-dir", str(tmp_path / "c"), "--json", str(out)])
    return json.loads(out.read_text())["metrics"]


@pytest.mark.slow
def test_evaluate_reads_text_files_as_the_run_did(tmp_path):
    """Row 4 (a): a run with `data.text_unit=line` (a document, here an example, per line) is
    evaluated per line too, not per block: its own validation file gives its last validation
    loss."""
    out = tmp_path / "run"
    train_txt = write_text_corpus(tmp_path / "train.txt", sample_docs(0, 60))
    val = write_text_corpus(tmp_path / "val.txt", sample_docs(100, 110))
    cfg = compose(
        overrides=tiny_overrides(
            out, "data=text", f"data.train_files={train_txt}", f"data.val_files={val}",
            "data.text_unit=line", "data.packing=document",
        )
    )  # fmt: skip
    val_loss = train(cfg)
    got = evaluated_loss(tmp_path, out / "checkpoints" / "last.ckpt", val)
    assert got["loss"] == pytest.approx(val_loss, abs=1e-5)


@pytest.mark.slow
def test_evaluate_scores_an_nsp_run_on_its_pairs(tmp_path):
    """Row 4 (b): an NSP run is evaluated on sentence pairs with its loss (MLM + NSP), as it
    validated, not as MLM on single texts."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl", 60)
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"text": d}) + "\n" for d in sample_docs(100, 120)))
    val_loss = train(compose(overrides=tiny_overrides(out, "data=c4_nsp", f"data.val_files={val}")))
    got = evaluated_loss(tmp_path, out / "checkpoints" / "last.ckpt", val)
    assert got["loss"] == pytest.approx(val_loss, abs=1e-5)
    assert got["loss"] == pytest.approx(got["mlm_loss"] + got["nsp_loss"], abs=1e-5)
