import csv
import json
import math

import pytest
import torch
from omegaconf import OmegaConf

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.commands.export_hf import export_hf
from bert_lightning.config import compose
from bert_lightning.errors import UserError
from bert_lightning.tasks.base import Task
from bert_lightning.tasks.kinds import make_task
from bert_lightning.training.finetune import finetune
from finetune_fixtures import (
    our_scores,
    overrides,
    task_files,
    write_dataset,
    write_hf_folder,
    write_our_ckpt,
    write_tokenizer,
)

MAIN_METRIC = {
    "seq_classification": ["acc", "f1", "mcc"],
    "regression": ["mse", "mae", "pearson", "spearman"],
    "ad_relevance": ["auroc", "spearman", "ndcg@10"],  # graded: threshold-free only
    "token_classification": ["precision", "recall", "f1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("task", sorted(MAIN_METRIC))
def test_each_task_trains_and_writes_its_outputs(tmp_path, task):
    write_tokenizer(tmp_path / "tokenizer.json")
    # 5 test rows of 48 drew one class, where MCC has no value (NaN); 12 hold both
    both = ["task.split.test=0.25"] if task == "seq_classification" else []
    files = task_files(tmp_path, task)
    results = finetune(compose("finetune", overrides(tmp_path, task, *files, *both)))
    run = tmp_path / "run"
    assert json.loads((run / "results.json").read_text()) == results
    assert sorted(results["test"]) == sorted(
        ["test/loss", *(f"test/{m}" for m in MAIN_METRIC[task])]
    )
    assert all(math.isfinite(v) for v in results["test"].values())
    assert results["init_from"] is None and results["steps"] > 0
    for name in ("metrics.csv", "loss_curve.png", "val_metric.png", "checkpoints/last.ckpt"):
        assert (run / name).is_file(), name
    assert results["best_val"]
    assert results["best_checkpoint"].startswith("checkpoints/best-step")  # the run's own folder
    with open(run / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sum(1 for r in rows if r.get("val/loss")) == 2  # one validation an epoch
    # the checkpoint rebuilds the task: label set / target scale travel in it
    pre = read_checkpoint(run / results["best_checkpoint"])
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
            f"init_from={path}",
            "freeze_encoder=true",
        ),
    )
    results = finetune(cfg)
    assert results["init_from"] and results["freeze_encoder"]
    after = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt").state_dict
    encoder = [k for k in before if k.startswith("bert.")]
    assert encoder and all(torch.equal(after[k], before[k]) for k in encoder)
    head = torch.nn.Linear(32, 2)  # a head is trained: it moved from its initial values
    assert after["classifier.weight"].shape == head.weight.shape
    assert after["classifier.weight"].abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize(
    "loss", ["task.loss=listwise", "task.loss=pointwise+listwise", "task.pairwise_loss=lambda"]
)
def test_each_ranking_loss_trains_and_its_loss_falls(tmp_path, loss):
    """The listwise loss alone and beside BCE, and the NDCG-weighted pairwise one, on batches
    of whole queries."""
    write_tokenizer(tmp_path / "tokenizer.json")
    files = task_files(tmp_path, "ad_relevance")  # graded, loss=pairwise
    extra = [loss, "trainer.max_epochs=20", "optim.lr=3e-3", "model.hidden_dropout_prob=0.0"]
    extra.append("callbacks.early_stopping.patience=20")
    results = finetune(compose("finetune", overrides(tmp_path, "ad_relevance", *files, *extra)))
    assert all(math.isfinite(v) for v in results["test"].values())
    with open(tmp_path / "run" / "metrics.csv") as f:
        losses = [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


def test_soft_labels_mix_an_encoders_order_into_the_training_targets(tmp_path):
    """soft_labels.encoder: each training row's target is (1 - w) x its label + w x the encoder's
    zero-shot cosine, min-max scaled over the rows; the run steps with it; a task without
    (query, ad) targets says so in one line."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    cfg = compose("finetune", overrides(tmp_path, "ad_relevance", "task.train_file=x"))
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    train = {"text": ["a", "b", "c"], "pair": ["x", "y", "z"], "target": [1.0, 0.0, 0.5]}
    got = task.with_soft_labels(train, lambda pairs: torch.tensor([0.2, 0.6, 0.4]), 0.25)
    assert got["target"] == pytest.approx([0.75 * 1.0, 0.25 * 1.0, 0.75 * 0.5 + 0.25 * 0.5])
    assert train["target"] == [1.0, 0.0, 0.5]  # a new table
    files = task_files(tmp_path, "ad_relevance")
    extra = [f"soft_labels.encoder={tmp_path / 'hf'}", "soft_labels.weight=0.5"]
    extra.append("trainer.max_steps=3")
    results = finetune(compose("finetune", overrides(tmp_path, "ad_relevance", *files, *extra)))
    assert results["steps"] == 3
    sentences = task_files(tmp_path, "seq_classification")
    cfg = compose("finetune", overrides(tmp_path, "seq_classification", *sentences, *extra))
    with pytest.raises(UserError, match="soft_labels.encoder: a seq_classification task has no"):
        finetune(cfg)


PRESETS = {  # conf/dataset/ preset: its task, the test metrics it reports
    "home_depot": ("ad_relevance", ["auroc", "spearman", "ndcg@10"]),
    "sst2": ("seq_classification", ["acc", "f1", "mcc"]),
    "cola": ("seq_classification", ["acc", "f1", "mcc"]),
    "wnut17": ("token_classification", ["precision", "recall", "f1"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_dataset_preset_trains_on_its_published_format(tmp_path, name):
    """`task=... dataset=NAME data_dir=FOLDER` is all a published data set needs."""
    task, metrics = PRESETS[name]
    write_tokenizer(tmp_path / "tokenizer.json")
    data = write_dataset(tmp_path / name, name)
    cfg = compose(
        "finetune",
        overrides(tmp_path, task, f"dataset={name}", f"data_dir={data}", "trainer.max_epochs=1"),
    )
    results = finetune(cfg)
    assert results["steps"] > 0
    assert sorted(results["test"]) == sorted(["test/loss", *(f"test/{m}" for m in metrics)])
    if name == "home_depot":  # graded 1-3 read as such; BM25 beside it (no zero-shot: random init)
        assert cfg.task.label_type == "graded" and list(results["baselines"]) == ["bm25"]
        assert sorted(results["baselines"]["bm25"]) == [f"test/{m}" for m in sorted(metrics)]
    if name in ("sst2", "cola", "wnut17"):  # the dev file is the test split
        assert results["rows"]["test"] == (16 if name != "wnut17" else 4)


@pytest.mark.slow
def test_bi_encoder_trains_beside_its_baselines(tmp_path):
    """results.json holds BM25 and the zero-shot cosine of the starting encoder; with
    `optim.head_lr` the head (20 cos - 10) moves at its own rate, the encoder at `optim.lr`.
    `task.architecture=bi_encoder` alone mean-pools: the model has no pooler."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    start = write_hf_folder(tmp_path / "hf", tok)
    data = write_dataset(tmp_path / "hd", "home_depot")
    extra = [f"data_dir={data}", f"init_from={tmp_path / 'hf'}", "task.architecture=bi_encoder"]
    extra += ["optim.lr=1e-7", "optim.head_lr=0.05"]
    cfg = compose("finetune", overrides(tmp_path, "ad_relevance", "dataset=home_depot", *extra))
    results = finetune(cfg)
    assert results["steps"] > 0 and sorted(results["baselines"]) == ["bm25", "zero_shot"]
    best = tmp_path / "run" / results["best_checkpoint"]
    state = torch.load(best, weights_only=True)["state_dict"]
    assert abs(float(state["model.classifier.bias"]) + 10) > 0.05  # Adam: ~0.05 a step
    pooler = {k for k in start if k.startswith("bert.pooler.")}
    assert pooler and not any(f"model.{k}" in state for k in pooler)
    moved = max((state[f"model.{k}"] - v).abs().max() for k, v in start.items() if k not in pooler)
    assert moved < 1e-5  # ~1e-7 a step
    for scores in (results["test"], *results["baselines"].values()):
        assert {"test/auroc", "test/spearman", "test/ndcg@10"} <= set(scores)
    # no transformers class computes it: exported as a sentence-transformers model, which
    # scores as the checkpoint does (tests/test_interop.py checks the vectors)
    folder = export_hf(best, str(tmp_path / "st"))
    pairs = [("drill 1", "cordless drill"), ("a lamp", "the lamp shade for a lamp")]
    torch.testing.assert_close(
        our_scores(folder, pairs), our_scores(best, pairs), atol=1e-6, rtol=0
    )


def test_a_bi_encoder_trains_with_the_in_batch_contrastive_term(tmp_path):
    """`task.contrastive_weight` steps a Home Depot bi-encoder; the training loss logged at the
    first step is BCE plus the term, larger than BCE alone from the same start."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    data = write_dataset(tmp_path / "hd", "home_depot")
    first = {}
    for weight in (0.0, 1.0):
        extra = [
            f"data_dir={data}",
            f"init_from={tmp_path / 'hf'}",
            "task.architecture=bi_encoder",
        ]
        extra += [f"task.contrastive_weight={weight}", f"paths.output_dir={tmp_path / str(weight)}"]
        extra += ["trainer.log_every_n_steps=1"]
        cfg = compose("finetune", overrides(tmp_path, "ad_relevance", "dataset=home_depot", *extra))
        assert finetune(cfg)["steps"] > 0
        with open(tmp_path / str(weight) / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
        first[weight] = float(next(r["train/loss"] for r in rows if r.get("train/loss")))
        assert all(math.isfinite(float(r["val/loss"])) for r in rows if r.get("val/loss"))
    assert first[1.0] > first[0.0] > 0


def test_layer_decay_fine_tunes_each_layer_at_its_rate(tmp_path):
    """`optim.layer_decay` in a fine-tuning run: metrics.csv logs each group's rate, the top
    layer of debug=tiny's 2 at lr x 0.5, the lower at x 0.25, the embeddings at x 0.125; the
    classifier at lr."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    files = task_files(tmp_path, "seq_classification")
    extra = [f"init_from={tmp_path / 'pre.ckpt'}", "optim.layer_decay=0.5", "optim.lr=1e-3"]
    extra += ["optim.warmup_ratio=0", "trainer.max_epochs=1"]
    cfg = compose("finetune", overrides(tmp_path, "seq_classification", *files, *extra))
    assert finetune(cfg)["steps"] > 0
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    first = next(r for r in rows if r.get("lr/model"))
    lr = float(first["lr/model"])
    for name, factor in (("layer1", 0.5), ("layer0", 0.25), ("embeddings", 0.125)):
        for suffix in ("", "_no_decay"):
            assert float(first[f"lr/model_{name}{suffix}"]) == pytest.approx(lr * factor)


def test_dropout_overrides_the_pretrained_models(tmp_path):
    """`dropout=` sets the encoder's dropout for fine-tuning (a checkpoint pretrained without
    dropout, as experiment=cpu_30min's, fine-tunes with BERT's 0.1)."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "pre.ckpt", tok)  # pretrained with 0.1
    files = task_files(tmp_path, "seq_classification")
    extra = [f"init_from={tmp_path / 'pre.ckpt'}", "dropout=0.0", "trainer.max_epochs=1"]
    results = finetune(
        compose("finetune", overrides(tmp_path, "seq_classification", *files, *extra))
    )
    saved = read_checkpoint(tmp_path / "run/checkpoints/last.ckpt")
    assert results["steps"] > 0
    assert saved.config.hidden_dropout_prob == saved.config.attention_probs_dropout_prob == 0.0


@pytest.mark.slow
def test_the_task_is_built_once_per_run(tmp_path, monkeypatch):
    """finetune.py builds the task from its config once, and trains and tests with the task
    that reading the data completed: what the train file fixed (the label set) reaches the
    checkpoint."""
    built = []
    init = Task.__init__

    def counted(self, cfg):
        built.append(cfg.labels)
        init(self, cfg)

    monkeypatch.setattr(Task, "__init__", counted)
    write_tokenizer(tmp_path / "tokenizer.json")
    files = task_files(tmp_path, "seq_classification")
    finetune(
        compose(
            "finetune",
            overrides(tmp_path, "seq_classification", *files, "trainer.max_epochs=1"),
        )
    )
    assert built == [None, ["0", "1"]]  # from the config, then completed by the train file
    saved = read_checkpoint(tmp_path / "run/checkpoints/last.ckpt").hparams["task"]
    assert saved["labels"] == ["0", "1"]
