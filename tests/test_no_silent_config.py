"""Issue #53's configuration class, kept so it stays fixed: a setting a user gives that the run
would ignore is refused in one line (the stream's files options: tests/test_no_silent_data.py);
and a fine-tuning run whose monitor never had a value says so instead of calling its first
checkpoint the best."""

import csv
import json
import logging
import math

import pytest
import torch

from bert_lightning.cli import main
from bert_lightning.config import compose
from bert_lightning.tasks import metrics
from bert_lightning.training.finetune import finetune
from finetune_fixtures import overrides, sentiment_rows, write_csv, write_our_ckpt, write_tokenizer
from helpers import pretrain_tiny


def cli_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def start(tmp_path):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    train = write_csv(tmp_path / "train.csv", sentiment_rows(20))
    hydra = f"hydra.run.dir={tmp_path / 'h'}"
    return tmp_path, ["finetune", f"task.train_file={train}", hydra, "debug=tiny"]


@pytest.mark.parametrize(
    "ignored",
    ["model=bert_mini", "model.hidden_size=64", "tokenizer=TOK", "tokenizer_vocab_size=99"],
)
def test_settings_of_a_random_start_are_refused_with_pretrained(start, capsys, ignored):
    tmp_path, argv = start
    ignored = ignored.replace("TOK", str(tmp_path / "tokenizer.json"))
    err = cli_error(capsys, *argv, f"pretrained={tmp_path / 'pre.ckpt'}", ignored)
    assert err == (
        f"error: {ignored}: pretrained={tmp_path / 'pre.ckpt'} gives the encoder and its "
        "tokenizer (these shape a random start only); leave them out"
    )
    assert not (tmp_path / "h" / "results.json").exists()


def test_a_vocabulary_size_is_refused_with_a_given_tokenizer(start, capsys):
    tmp_path, argv = start
    tok = tmp_path / "tokenizer.json"
    err = cli_error(capsys, *argv, f"tokenizer={tok}", "tokenizer_vocab_size=99")
    assert err == (
        f"error: tokenizer_vocab_size=99: tokenizer={tok} is used as it is (the size of a "
        "tokenizer trained on the train file); leave it out"
    )


def test_a_soft_label_weight_without_its_encoder_is_refused(start, capsys):
    tmp_path, argv = start
    err = cli_error(capsys, *argv, "soft_labels.weight=0.9")
    assert err == (
        "error: soft_labels.weight=0.9: weighs soft_labels.encoder's zero-shot scores, and no "
        "soft_labels.encoder is given; give one or leave the weight out"
    )


def test_split_fractions_of_parts_given_as_files_are_refused(start, capsys):
    """`task.split` cuts a missing validation or test file from the train file: with both
    files given it would cut nothing, and the rows would stay as the files have them."""
    tmp_path, argv = start
    files = [
        f"task.{k}_file={write_csv(tmp_path / f'{k}.csv', sentiment_rows(8))}"
        for k in ("validation", "test")
    ]
    err = cli_error(capsys, *argv, *files, "task.split.validation=0.5", "task.split.test=0.4")
    assert err == (
        "error: task.split.validation=0.5 task.split.test=0.4: task.validation_file and "
        "task.test_file given, task.train_file is not cut for them (the fractions are of a "
        "missing file's rows); leave them out"
    )


def test_a_monitor_with_no_value_at_any_validation_is_said(tmp_path, monkeypatch, caplog):
    """Lightning keeps a NaN score as -inf: the first checkpoint stays "best"; the run says the
    monitor had no value and `results.json` holds NaN, not -inf."""
    write_tokenizer(tmp_path / "tokenizer.json")
    train = write_csv(tmp_path / "train.csv", sentiment_rows(48))
    monkeypatch.setattr(
        metrics.MatthewsCorrCoef, "compute", lambda self: torch.tensor(float("nan"))
    )
    cfg = compose(
        "finetune",
        overrides(tmp_path, "seq_classification", f"task.train_file={train}", "task.monitor=mcc"),
    )
    with caplog.at_level(logging.WARNING):
        results = finetune(cfg)
    assert "val/mcc had no value at any validation (NaN): the checkpoint kept" in caplog.text
    assert math.isnan(results["best_val"]["val/mcc"])
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert math.isnan(saved["best_val"]["val/mcc"])


@pytest.mark.parametrize(
    "task, monitor, mode",
    [
        ("regression", "pearson", "max"),
        ("regression", "mse", "min"),
        ("seq_classification", "loss", "min"),
        ("ad_relevance", "ndcg@10", "max"),
    ],
)
def test_the_checkpoint_and_early_stopping_follow_the_monitors_direction(task, monitor, mode):
    cfg = compose("finetune", [f"task={task}", f"task.monitor={monitor}", "task.train_file=x"])
    callbacks = cfg.callbacks
    assert cfg.task.mode == callbacks.model_checkpoint.mode == callbacks.early_stopping.mode == mode


@pytest.mark.parametrize(
    "monitor, mode",
    [("val/loss", "min"), ("val/ppl", "min"), ("val/mlm_acc", "max"), ("null", "min")],
)
def test_pretrainings_best_checkpoint_follows_the_monitors_direction(monitor, mode):
    cfg = compose(overrides=[f"callbacks.model_checkpoint.monitor={monitor}"])
    assert cfg.callbacks.model_checkpoint.mode == mode


def test_validation_every_n_steps_counts_optimizer_steps_when_batches_accumulate(tmp_path):
    """`val_check_interval: 3` (debug=tiny's) with 2 batches a step: steps 3 and 6, as without
    accumulation (Lightning counts batches)."""
    pretrain_tiny(tmp_path, "trainer.accumulate_grad_batches=2")
    with open(tmp_path / "metrics.csv", newline="") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r["val/loss"]]
    assert steps == [0, 3, 6]
