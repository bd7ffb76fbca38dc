"""`bert-lightning evaluate`: a fine-tuned checkpoint's task metrics on any file (those
finetune() writes for a test file), a pretraining checkpoint's MLM metrics on any corpus (those
its run logs for the same validation files); `score`/`evaluate` read a file as the task did."""

import json
import logging
import math
from types import SimpleNamespace

import pandas as pd
import pytest

from bert_lightning.cli import main
from bert_lightning.config import bundled, compose
from bert_lightning.data.corpus import iter_documents
from bert_lightning.training import callbacks
from bert_lightning.training.finetune import finetune
from bert_lightning.training.pretrain import train
from finetune_fixtures import ad_rows, sentiment_rows, write_csv, write_hf_folder, write_tokenizer
from helpers import cli_error, shipped, tiny_overrides, write_corpus

COLA_NAMES = ["source", "label", "original", "sentence"]  # GLUE CoLA: a TSV without header


def write_cola(path, rows) -> None:
    path.write_text("".join(f"src\t{r['label']}\t\t{r['sentence']}\n" for r in rows))


@pytest.mark.slow
def test_evaluate_gives_the_test_metrics_finetune_wrote(tmp_path, capsys):
    write_tokenizer(tmp_path / "tokenizer.json")
    write_cola(tmp_path / "train.tsv", sentiment_rows(48))
    rows = sentiment_rows(16, seed=1)
    write_cola(tmp_path / "test.tsv", rows)
    cfg = compose(
        "finetune",
        [
            f"task.train_file={tmp_path / 'train.tsv'}",
            f"task.test_file={tmp_path / 'test.tsv'}",
            "task.header=false",
            f"task.names=[{','.join(COLA_NAMES)}]",
            f"paths.output_dir={tmp_path / 'run'}",
            f"data.tokenizer.path={tmp_path / 'tokenizer.json'}",
            "debug=tiny",
            "trainer.max_epochs=1",
        ],
    )
    results = finetune(cfg)
    ckpt = str(tmp_path / "run" / results["best_checkpoint"])
    out = tmp_path / "eval.json"
    main(["evaluate", ckpt, str(tmp_path / "test.tsv"), "--json", str(out)])
    got = json.loads(out.read_text())
    assert got["kind"] == "fine-tuning" and got["metrics"]["rows"] == len(rows)
    want = {k.removeprefix("test/"): v for k, v in results["test"].items()}
    assert {k: got["metrics"][k] for k in want} == pytest.approx(want, abs=1e-6)
    assert "acc" in capsys.readouterr().out

    # the same rows with a header row, told on the command line
    pd.DataFrame(rows).to_csv(tmp_path / "test.csv", index=False)
    main(["evaluate", ckpt, str(tmp_path / "test.csv"), "--header", "--json", str(out)])
    assert json.loads(out.read_text())["metrics"]["acc"] == pytest.approx(want["acc"])

    # score reads the headerless TSV as the task did: no "no column 'sentence'"
    main(["score", ckpt, str(tmp_path / "test.tsv"), str(tmp_path / "scored.csv")])
    scored = pd.read_csv(tmp_path / "scored.csv")
    assert list(scored.columns) == [*COLA_NAMES, "score"] and len(scored) == len(rows)


@pytest.mark.slow
def test_evaluate_reads_the_order_within_queries_as_the_run_did(tmp_path, capsys, caplog):
    """An ad relevance run's `results.json` holds the per-query metrics with intervals of the
    model and of its baselines (BM25; the zero-shot encoder given a start) and the paired
    differences; `evaluate` of its checkpoint on the test file prints and writes the same."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    write_csv(tmp_path / "train.csv", ad_rows(18)[18:])  # no query of the test file
    write_csv(tmp_path / "test.csv", ad_rows(6)[::-1])
    cfg = compose(
        "finetune",
        [
            "task=ad_relevance",
            "task.label_type=graded",
            f"task.train_file={tmp_path / 'train.csv'}",
            f"task.test_file={tmp_path / 'test.csv'}",
            f"init_from={tmp_path / 'hf'}",
            f"paths.output_dir={tmp_path / 'run'}",
            "debug=tiny",
            "trainer.max_epochs=1",
        ],
    )
    with caplog.at_level(logging.INFO):
        results = finetune(cfg)
    printed = caplog.text
    ranking = results["ranking"]
    assert list(ranking) == [
        "fine-tuned", "bm25", "zero_shot", "fine-tuned - bm25", "fine-tuned - zero_shot"
    ]  # fmt: skip
    cell = ranking["fine-tuned - zero_shot"]["ndcg@10"]
    assert cell["queries"] == 6 and cell["low"] <= cell["mean"] <= cell["high"]
    # a name means one thing in results.json: ndcg@10 is over queries in the test metrics too;
    # spearman over all rows is the test metric, within each query `query_spearman`
    tested = ranking["fine-tuned"]
    assert results["test"]["test/ndcg@10"] == pytest.approx(tested["ndcg@10"]["mean"], abs=1e-5)
    assert "spearman" not in tested and "test/query_spearman" not in results["test"]
    assert f"{cell['mean']:+.3f} [{cell['low']:+.3f}, {cell['high']:+.3f}]" in printed
    out = tmp_path / "eval.json"
    ckpt = str(tmp_path / "run" / results["best_checkpoint"])
    main(["evaluate", ckpt, str(tmp_path / "test.csv"), "--zero-shot", str(tmp_path / "hf")])
    main(["evaluate", ckpt, str(tmp_path / "test.csv"), "--json", str(out)])
    assert "fine-tuned - zero_shot" in capsys.readouterr().out
    got = json.loads(out.read_text())["metrics"]
    assert list(got["ranking"]) == ["fine-tuned", "bm25", "fine-tuned - bm25"]
    for who in got["ranking"]:
        for m, c in got["ranking"][who].items():
            assert c == pytest.approx(ranking[who][m], abs=1e-6)


@pytest.mark.slow
def test_evaluate_reads_a_file_named_and_graded_otherwise(tmp_path, capsys, caplog):
    """Another query-product file: its own column names (`--column`), labels on another scale
    (`--grades`); a UTF-8 file is refused as the Latin-1 the model's task carries, in one
    line, rather than scored garbled."""
    write_tokenizer(tmp_path / "tokenizer.json")
    write_csv(tmp_path / "train.csv", ad_rows(12))
    cfg = compose(
        "finetune",
        [
            "task=ad_relevance",
            "task.label_type=graded",
            "task.encoding=latin-1",
            f"task.train_file={tmp_path / 'train.csv'}",
            f"paths.output_dir={tmp_path / 'run'}",
            f"data.tokenizer.path={tmp_path / 'tokenizer.json'}",
            "debug=tiny",
            "trainer.max_epochs=1",
        ],
    )
    ckpt = str(tmp_path / "run" / finetune(cfg)["best_checkpoint"])
    rows = [
        {"search_term": r["query"], "product_title": r["ad"] + " café", "relevance": 2 * r["label"]}
        for r in ad_rows(4)
    ]
    pd.DataFrame(rows).to_csv(tmp_path / "other.csv", index=False, encoding="utf-8")
    names = ["--column", "query=search_term", "--column", "ad=product_title"]
    utf8 = ["--encoding", "utf-8"]
    with pytest.raises(SystemExit):  # grades 2-6 are outside the model's 1-3
        main(
            [
                "evaluate",
                ckpt,
                str(tmp_path / "other.csv"),
                *names,
                "--column",
                "label=relevance",
                *utf8,
            ]
        )
    assert "label 6.0 is not a grade in [1.0, 3.0]" in capsys.readouterr().err
    out = tmp_path / "eval.json"
    grades = ["--column", "label=relevance", "--grades", "2,6", "--json", str(out)]
    line = cli_error(capsys, "evaluate", ckpt, tmp_path / "other.csv", *names, *grades)
    assert line == (
        f"error: {tmp_path / 'other.csv'}: line 2 reads as UTF-8 ('café'), but the encoding "
        "given is latin-1 ('cafÃ©'); a UTF-8 file is read with --encoding utf-8 "
        "(task.encoding=utf-8)"
    )
    assert not out.exists()
    main(["evaluate", ckpt, str(tmp_path / "other.csv"), *names, *grades, *utf8])
    assert json.loads(out.read_text())["metrics"]["rows"] == len(rows)
    with pytest.raises(SystemExit):
        main(["evaluate", ckpt, str(tmp_path / "other.csv"), "--column", "text=search_term"])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "--column text=search_term: expected KEY=NAME with KEY one of label, group, query, ad, "
            "clicks, impressions (the columns of its ad_relevance task)"
        )
    )


@pytest.mark.slow
def test_evaluate_gives_the_mlm_loss_the_run_validated_with(tmp_path, caplog, capsys):
    """With no settings given: the length, framing, batch size, seed and masking the run's
    checkpoint records (none of them the defaults), so the run's own validation loss."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl", 60)
    val = tmp_path / "val.jsonl"
    docs = list(iter_documents([bundled("c4_sample.jsonl")]))[100:120]
    val.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    ran = ["data.packing=document", "seed=7", "data.masking.mlm_probability=0.3"]
    with caplog.at_level("INFO", logger="bert_lightning.data.pretraining"):
        val_loss = train(compose(overrides=tiny_overrides(out, f"data.val_files={val}", *ran)))
    assert "every document of data.train_files trains" in caplog.text  # the switch is said

    report = tmp_path / "mlm.json"
    args = ["--cache-dir", str(tmp_path / "c")]
    capsys.readouterr()
    main(
        ["evaluate", str(out / "checkpoints" / "last.ckpt"), str(val), *args, "--json", str(report)]
    )
    got = json.loads(report.read_text())
    assert got["kind"] == "pretraining"
    batches = math.ceil(got["metrics"]["examples"] / 8)  # off a terminal: a line at the last
    assert capsys.readouterr().out.splitlines()[0] == f"batch {batches}/{batches} eta 0m00s"
    assert got["metrics"]["loss"] == pytest.approx(val_loss, rel=1e-5)
    assert 0 <= got["metrics"]["mlm_acc"] < 1 and got["metrics"]["ppl"] > 1
    # a setting given overrides the record: other masks, another loss
    main(["evaluate", str(out / "checkpoints" / "last.ckpt"), str(val), *args, "--seed", "8"])
    assert f"loss  {val_loss:.6g}" not in capsys.readouterr().out


def test_evaluate_prints_a_line_every_n_batches_off_a_terminal(monkeypatch, capsys):
    """As a run's steps, not Lightning's Rich bar (silent there until the end, then a line of
    box characters): a batch a second, `every=2`, a line at 2, 4 and the last."""
    now = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    shipped_bar = shipped("callbacks/_progress")["progress_bar"]
    cadence = {k: v for k, v in shipped_bar.items() if k != "_target_"}
    bar = callbacks.EvalProgressBar(**cadence | {"every": 2}, tty=False)
    trainer = SimpleNamespace(num_test_batches=[5])
    bar.on_test_start(trainer, None)
    for i in range(5):
        now[0] = i + 1.0
        bar.on_test_batch_end(trainer, None, None, None, i)
    bar.on_test_end(trainer, None)
    assert capsys.readouterr().out.splitlines() == [
        "batch 2/5 eta 0m03s",
        "batch 4/5 eta 0m01s",
        "batch 5/5 eta 0m00s",
    ]


@pytest.mark.parametrize("option", ["c4_sample", "c4_nsp", "text", "brackets", "c4_hub"])
def test_the_data_record_holds_each_setting_evaluate_frames_files_by(option, tmp_path):
    """Each data option's record (the checkpoint's one data record) holds every setting of
    `evaluate.VALIDATION_KEYS` its config has, at the config's value: `evaluate` then frames,
    masks and batches files as the run validated, never at `conf/data`'s defaults."""
    from omegaconf import OmegaConf

    from bert_lightning.commands.evaluate import VALIDATION_KEYS
    from bert_lightning.training.instantiate import instantiate

    files = [f"data.train_files={write_corpus(tmp_path / 'c.jsonl')}"] * (option == "text")
    cfg = compose(overrides=["paths.output_dir=.", f"data={option}", *files]).data
    dm = instantiate(cfg, "data", out_dir=None)
    want = {k: OmegaConf.to_container(cfg, resolve=True)[k] for k in VALIDATION_KEYS if k in cfg}
    record = dm.data_record()
    assert {k: record.get(f"data.{k}", "missing") for k in want} == want
