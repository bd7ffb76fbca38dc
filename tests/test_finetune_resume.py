"""Fine-tuning resumes exactly from `ckpt_path`, and its checkpoint carries the sequence length
it was fine-tuned with (what `bert-lightning score` truncates to by default)."""

import csv
import json
from pathlib import Path

import lightning as L
import pytest
import torch

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.inference import load_finetuned
from bert_lightning.signals import Interrupted
from bert_lightning.training.finetune import finetune
from finetune_fixtures import overrides, task_files, write_tokenizer


def run(tmp_path, out, *extra):
    cfg = compose(
        "finetune",
        [
            *overrides(tmp_path, "seq_classification", *task_files(tmp_path, "seq_classification")),
            f"paths.output_dir={out}",
            "batch_size=4",  # ~10 batches an epoch: step 4 is mid-epoch
            "trainer.max_steps=8",
            "trainer.max_epochs=-1",
            "trainer.val_check_interval=2",
            "trainer.check_val_every_n_epoch=null",
            "callbacks.model_checkpoint.every_n_train_steps=4",  # last.ckpt at 4 and 8,
            "callbacks.model_checkpoint.save_top_k=-1",  # whether or not the metric improved
            "~callbacks.early_stopping",  # all 8 steps run
            *extra,
        ],
    )
    return finetune(cfg)


@pytest.mark.slow
def test_killed_and_resumed_finetuning_matches_the_uninterrupted_one(tmp_path):
    write_tokenizer(tmp_path / "tokenizer.json")
    run(tmp_path, tmp_path / "whole")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(
            tmp_path,
            tmp_path / "killed",
            "+callbacks.crash._target_=probe.CrashAt",
            "+callbacks.crash.step=4",
        )
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 4 and state["epoch"] == 0
    run(tmp_path, tmp_path / "resumed", f"ckpt_path={last}")

    whole = torch.load(tmp_path / "whole/checkpoints/last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=True)
    assert resumed["global_step"] == whole["global_step"] == 8
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name


def test_the_checkpoint_keeps_the_fine_tuned_max_seq_length(tmp_path):
    write_tokenizer(tmp_path / "tokenizer.json")
    run(tmp_path, tmp_path / "run", "trainer.max_steps=2", "max_seq_length=24")
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert read_checkpoint(ckpt).hparams["max_seq_length"] == 24
    # `bert-lightning score`'s default
    assert load_finetuned(ckpt).max_seq_length == 24


class Batches(L.Callback):
    """Appends each training batch's step and token-id sum to `batches.jsonl` in the run folder
    (a batch begun by a run stopped before its step is done is logged again by the resumed
    run: the last line of a step is the batch it trained on)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        with open(Path(trainer.default_root_dir) / "batches.jsonl", "a") as f:
            f.write(json.dumps([trainer.global_step, int(batch["input_ids"].sum())]) + "\n")


def epochs_run(tmp_path, out, *extra):
    """Fine-tuning's own schedule (a validation at each epoch's end, early stopping on the
    loss, the step count from the loader) on 38 rows in batches of 5: 8 steps an epoch; 5
    validation rows in batches of 4, 2 batches."""
    cfg = compose(
        "finetune",
        [
            *overrides(tmp_path, "seq_classification", *task_files(tmp_path, "seq_classification")),
            f"paths.output_dir={out}",
            "batch_size=5",
            "eval_batch_size=4",
            "trainer.max_epochs=6",
            "task.monitor=loss",
            "task.mode=min",
            "callbacks.early_stopping.patience=1",
            f"+callbacks.batches._target_={__name__}.Batches",
            *extra,
        ],
    )
    return finetune(cfg)


def outcome(run: Path) -> dict:
    """What a stop and resume must not change: the batches trained on, in order, every
    validation with its step, the checkpoints, last.ckpt's step and weights, results.json."""
    trained = dict(json.loads(line) for line in (run / "batches.jsonl").read_text().splitlines())
    with open(run / "metrics.csv", newline="") as f:
        vals = [(r["step"], r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")]
    last = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    results = json.loads((run / "results.json").read_text())
    return {
        "batches": [trained[s] for s in sorted(trained)],
        "validations": vals,
        "checkpoints": sorted(p.name for p in (run / "checkpoints").iterdir()),
        "last step": last["global_step"],
        "weights": last["state_dict"],
        "results": {k: v for k, v in results.items() if k.startswith(("test", "best"))},
    }


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("finetune")
    write_tokenizer(tmp_path / "tokenizer.json")
    epochs_run(tmp_path, tmp_path / "whole")
    return tmp_path, outcome(tmp_path / "whole")


STOPS = {  # how the run is stopped, what it raises, the step last.ckpt is at
    # SIGTERM mid-epoch 0: the resume continues that epoch's shuffle at its fifth batch
    "signal mid-epoch": (["probe.SignalRank", "step=3", "rank=0", "sig=SIGTERM"], Interrupted, 4),
    # a crash in epoch 1 after epoch 0's last.ckpt: epoch 1's shuffle comes from the seed
    "crash in the next epoch": (["probe.CrashAt", "step=11"], RuntimeError, 8),
    # SIGTERM in epoch 0's validation (2 batches): abandoned, the resume redoes it at step 8
    "signal in a validation": (
        ["test_signals_phases.SignalMidValidation", "batch=0"],
        Interrupted,
        8,
    ),
    # SIGTERM in its last batch: the validation is whole, the run stops after step 9
    "signal in a validations last batch": (
        ["test_signals_phases.SignalMidValidation", "batch=1"],
        Interrupted,
        9,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("stop", list(STOPS))
def test_a_stopped_fine_tuning_resumed_in_its_folder_is_the_uninterrupted_one(uninterrupted, stop):
    """Stopped and resumed from its `last.ckpt` in its own folder, a run fine-tuned for epochs
    trains on the same batches in the same order, validates at the same steps with the same
    figures, stops early at the same epoch and keeps the same best checkpoint, and its final
    state lands in `last.ckpt` (no `last-v1.ckpt`) with the same weights, bit for bit."""
    tmp_path, whole = uninterrupted
    target, *args = STOPS[stop][0]
    probe = [f"+callbacks.stop._target_={target}", *(f"+callbacks.stop.{a}" for a in args)]
    out = tmp_path / stop.replace(" ", "_")
    with pytest.raises(STOPS[stop][1]):
        epochs_run(tmp_path, out, *probe)
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == STOPS[stop][2]
    epochs_run(tmp_path, out, f"ckpt_path={last}")
    resumed = outcome(out)
    for key in ("batches", "validations", "checkpoints", "last step", "results"):
        assert resumed[key] == whole[key], key
    for name, tensor in whole["weights"].items():
        assert torch.equal(tensor, resumed["weights"][name]), name
