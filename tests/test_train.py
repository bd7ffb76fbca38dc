import csv
import json
import os
import sys

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.data.corpus import BadRecordError
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.training.pretrain import train
from helpers import pretrain_tiny, tiny_overrides, write_corpus


def metric_rows(out_dir):
    with open(out_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_smoke_run_writes_outputs_and_resumes(tmp_path):
    out = tmp_path / "run"
    val_loss = pretrain_tiny(out, "logger=wandb")
    assert val_loss is not None and val_loss > 0
    ckpt = out / "checkpoints" / "last.ckpt"
    for name in [
        "tokenizer.json",
        "metrics.csv",
        "loss_curve.png",
        "config_resolved.yaml",
    ]:
        assert (out / name).is_file(), name
    assert list((out / "checkpoints").glob("best-step*.ckpt"))
    assert list((out / "wandb").glob("offline-run-*"))  # wandb ran offline
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["global_step"] == 6 and state["tokenizer"]
    rows = metric_rows(out)
    assert [r["step"] for r in rows if r["val/loss"]] == ["0", "3", "6"]
    assert any(r["train/flops_per_s"] for r in rows)
    assert "train/mfu" not in rows[0]  # a CPU with no configured peak: MFU omitted

    resumed = tmp_path / "resumed"
    write_corpus(resumed / "corpus.jsonl")
    peak = "callbacks.throughput.peak_flops=1e9"
    train(
        compose(overrides=tiny_overrides(resumed, f"ckpt_path={ckpt}", "trainer.max_steps=9", peak))
    )
    state = torch.load(resumed / "checkpoints" / "last.ckpt", weights_only=True)
    assert state["global_step"] == 9
    steps = [int(r["step"]) for r in metric_rows(resumed) if r["train/loss"]]
    assert min(steps) == 7 and max(steps) == 9  # the step count continues
    mfu = [
        (float(r["train/mfu"]), float(r["train/flops_per_s"]))
        for r in metric_rows(resumed)
        if r["train/mfu"]
    ]
    assert mfu and all(m == pytest.approx(f / 1e9) for m, f in mfu)
    tok_a = (out / "tokenizer.json").read_text()
    assert (resumed / "tokenizer.json").read_text() == tok_a


def test_sinusoidal_position_init_trains(tmp_path):
    """`model.position_embedding_init=sinusoidal` takes steps end to end and the loss falls;
    the run's checkpoint records the option."""
    steps = ("trainer.max_steps=20", "trainer.val_check_interval=10", "optim.warmup_steps=0")
    pretrain_tiny(tmp_path, "model.position_embedding_init=sinusoidal", "optim.lr=1e-2", *steps)
    losses = [float(r["train/loss"]) for r in metric_rows(tmp_path) if r["train/loss"]]
    assert len(losses) == 20 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.15
    ckpt = read_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt.config.position_embedding_init == "sinusoidal"


@pytest.mark.parametrize("packing", ["document", "packed_isolated"])
def test_each_packing_trains(tmp_path, packing):
    """The other framings take steps end to end (per-document padded batches, unpadded in the
    encoder; packed blocks attending within each document) and the loss falls."""
    steps = ("trainer.max_steps=20", "trainer.val_check_interval=10")
    pretrain_tiny(
        tmp_path, f"data.packing={packing}", "optim.lr=1e-2", "optim.warmup_steps=0", *steps
    )
    losses = [float(r["train/loss"]) for r in metric_rows(tmp_path) if r["train/loss"]]
    assert len(losses) == 20 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.15
    assert all(r["val/loss"] != "nan" for r in metric_rows(tmp_path))


def test_bad_corpus_fails_cleanly(tmp_path):
    out = tmp_path / "run"
    corpus = write_corpus(out / "corpus.jsonl", 20)
    with open(corpus, "a") as f:
        f.write('{"url": "no text here"}\n')
    with pytest.raises(BadRecordError, match=r"corpus\.jsonl:21: no 'text' field"):
        train(compose(overrides=tiny_overrides(out)))
    assert sorted(os.listdir(out)) == ["FAILED", "corpus.jsonl", "hf_cache"]
    cached = [p.name for p in (out / "hf_cache").rglob("*") if p.is_file()]
    assert all(name.endswith(".lock") for name in cached), cached  # nothing half-written


def test_missing_data_path_is_named(tmp_path):
    cfg = compose(overrides=tiny_overrides(tmp_path, f"data.train_files={tmp_path}/nope/*.json.gz"))
    with pytest.raises(MissingFileError, match="nope/\\*.json.gz: no file matches"):
        train(cfg)


@pytest.mark.parametrize("option", ["wandb", "tensorboard"])
def test_logger_without_its_package_is_a_one_line_hint(tmp_path, monkeypatch, option):
    monkeypatch.setitem(sys.modules, option, None)  # as if not installed
    cfg = compose(overrides=tiny_overrides(tmp_path, f"logger={option}"))
    with pytest.raises(InstantiationException) as e:  # the entry points print its UserError
        instantiate(cfg.logger[option])
    e = e.value.__cause__
    assert isinstance(e, UserError)
    assert str(e) == f'logger={option} needs {option}: pip install "bert-lightning[{option}]"'


@pytest.mark.slow
def test_tensorboard_logger_writes_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    out = tmp_path / "run"
    pretrain_tiny(out, "logger=tensorboard", "trainer.max_steps=2", "validate_before_fit=false")
    (events,) = (out / "tensorboard").glob("events.out.tfevents.*")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(events))
    acc.Reload()
    assert "train/loss" in acc.Tags()["scalars"]
    assert (out / "metrics.csv").is_file()  # the CSV logger still runs beside it


@pytest.mark.parametrize("every", [4, 3])
def test_the_best_checkpoint_is_the_best_validation_with_its_weights(tmp_path, every):
    """With last.ckpt every N steps (crash recovery), the best checkpoint is still the step of
    the lowest validation loss, holding that step's weights and score: a step's save never
    ranks the weights by an earlier validation's score, nor hides the validation at its step."""
    write_corpus(tmp_path / "corpus.jsonl")
    over = ["trainer.max_steps=12", "trainer.val_check_interval=4", "validate_before_fit=false"]
    ckpt = [f"callbacks.model_checkpoint.every_n_train_steps={every}"]
    train(compose(overrides=tiny_overrides(tmp_path, *over, *ckpt)))
    scored = {int(r["step"]): float(r["val/loss"]) for r in metric_rows(tmp_path) if r["val/loss"]}
    assert list(scored) == [4, 8, 12]
    step = min(scored, key=scored.get)
    [best] = (tmp_path / "checkpoints").glob("best-step*.ckpt")
    assert best.name == f"best-step{step}.ckpt"
    assert torch.load(best, weights_only=True)["global_step"] == step
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    [state] = [v for k, v in last["callbacks"].items() if k.startswith("ModelCheckpoint")]
    assert float(state["best_model_score"]) == pytest.approx(scored[step], abs=1e-6)


def test_a_step_a_validation_follows_is_saved_before_that_validation(tmp_path):
    """With last.ckpt every N steps, a step that a validation follows is in last.ckpt before
    the validation starts: a kill inside that validation (a long one, a scheduler's grace
    period run out) resumes from that step, not from N steps earlier; before any validation
    too (Lightning's would wait for a score)."""
    write_corpus(tmp_path / "corpus.jsonl")
    over = ["trainer.max_steps=8", "trainer.val_check_interval=4", "validate_before_fit=false"]
    probe = ["+callbacks.last._target_=probe.LastAtValidation"]
    ckpt = ["callbacks.model_checkpoint.every_n_train_steps=4"]
    train(compose(overrides=tiny_overrides(tmp_path, *over, *ckpt, *probe)))
    seen = (tmp_path / "last_at_validation.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in seen] == [[4, 4], [8, 8]]
