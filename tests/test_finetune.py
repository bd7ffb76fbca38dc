import csv
import json
import math

import pytest
import torch

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.training.finetune import finetune
from finetune_fixtures import (
    ad_rows,
    regression_rows,
    sentiment_rows,
    write_conll,
    write_csv,
    write_hf_folder,
    write_jsonl,
    write_our_ckpt,
    write_tokenizer,
)


def overrides(tmp_path, task, *extra):
    return [
        f"task={task}",
        f"paths.output_dir={tmp_path / 'run'}",
        f"tokenizer={tmp_path / 'tokenizer.json'}",
        "model.hidden_size=32",
        "model.num_hidden_layers=2",
        "model.num_attention_heads=2",
        "model.intermediate_size=64",
        "model.max_position_embeddings=64",
        "max_seq_length=32",
        "batch_size=8",
        "optim.lr=1e-3",
        "trainer.accelerator=cpu",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        *extra,
    ]


def task_files(tmp_path, task):
    if task == "seq_classification":
        train = write_csv(tmp_path / "train.csv", sentiment_rows(48))
        return [f"task.train_file={train}"]
    if task == "regression":
        return [f"task.train_file={write_jsonl(tmp_path / 'train.jsonl', regression_rows(48))}"]
    if task == "ad_relevance":
        train = write_csv(tmp_path / "ads.tsv", ad_rows(12), sep="\t")
        # ranking: the pairwise loss, on batches of whole queries
        return [
            f"task.train_file={train}",
            "task.label_type=graded",
            "task.monitor=ndcg@10",
            "task.loss=pairwise",
        ]
    train = write_conll(tmp_path / "train.conll")
    dev = write_conll(tmp_path / "dev.conll", copies=2)
    return [f"task.train_file={train}", f"task.validation_file={dev}", f"task.test_file={dev}"]


MAIN_METRIC = {
    "seq_classification": ["acc", "f1", "mcc"],
    "regression": ["mse", "mae", "pearson", "spearman"],
    "ad_relevance": ["auroc", "acc", "f1", "spearman", "ndcg@10"],
    "token_classification": ["precision", "recall", "f1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(MAIN_METRIC))
def test_each_task_trains_and_writes_its_outputs(tmp_path, task):
    write_tokenizer(tmp_path / "tokenizer.json")
    results = finetune(compose("finetune", overrides(tmp_path, task, *task_files(tmp_path, task))))
    run = tmp_path / "run"
    assert json.loads((run / "results.json").read_text()) == results
    assert sorted(results["test"]) == sorted(
        ["test/loss", *(f"test/{m}" for m in MAIN_METRIC[task])]
    )
    assert all(math.isfinite(v) for v in results["test"].values())
    assert results["pretrained"] is None and results["steps"] > 0
    for name in ("metrics.csv", "loss_curve.png", "val_metric.png", "checkpoints/last.ckpt"):
        assert (run / name).is_file(), name
    assert results["best_checkpoint"] and results["best_val"]
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sum(1 for r in rows if r.get("val/loss")) == 2  # one validation an epoch
    # the checkpoint rebuilds the task: label set / target scale travel in it
    pre = read_checkpoint(results["best_checkpoint"])
    assert pre.hparams["task"]["kind"] == task
    assert set(pre.state_dict) >= {"classifier.weight", "classifier.bias"}


@pytest.mark.slow
def test_classification_loss_falls_and_learns(tmp_path):
    write_tokenizer(tmp_path / "tokenizer.json")
    cfg = compose(
        "finetune",
        overrides(
            tmp_path,
            "seq_classification",
            *task_files(tmp_path, "seq_classification"),
            "trainer.max_epochs=20",
            "optim.lr=3e-3",
            "model.hidden_dropout_prob=0.0",
            "callbacks.early_stopping.patience=20",
            "task.split.test=0.25",
        ),
    )
    results = finetune(cfg)
    with open(tmp_path / "run" / "metrics.csv") as f:
        losses = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    assert results["test"]["test/acc"] >= 0.9  # the adjective decides the label


@pytest.mark.slow
@pytest.mark.parametrize("source", ["ckpt", "hf"])
def test_frozen_encoder_stays_bitwise_unchanged(tmp_path, source):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    if source == "ckpt":
        path = tmp_path / "pre.ckpt"
        before = write_our_ckpt(path, tok)
    else:
        path = tmp_path / "hf"
        before = write_hf_folder(path, tok)
    cfg = compose(
        "finetune",
        overrides(
            tmp_path,
            "seq_classification",
            *task_files(tmp_path, "seq_classification"),
            f"pretrained={path}",
            "freeze_encoder=true",
        ),
    )
    results = finetune(cfg)
    assert results["pretrained"] and results["freeze_encoder"]
    after = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt").state_dict
    encoder = [k for k in before if k.startswith("bert.")]
    assert encoder and all(torch.equal(after[k], before[k]) for k in encoder)
    head = torch.nn.Linear(32, 2)  # a head is trained: it moved from its initial values
    assert after["classifier.weight"].shape == head.weight.shape
    assert after["classifier.weight"].abs().sum() > 0
