"""Fine-tuning resumes exactly from `ckpt_path` into another folder, and its checkpoint carries
the sequence length it was fine-tuned with (what `bert-lightning score` truncates to by
default). Stopped and resumed in its own folder, in every phase: tests/test_stop_resume.py."""

import pytest
import torch

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.inference import load_finetuned
from bert_lightning.training.finetune import finetune
from finetune_fixtures import overrides, task_files, write_tokenizer


def run(tmp_path, out, *extra):
    cfg = compose(
        "finetune",
        [
            *overrides(tmp_path, "seq_classification", *task_files(tmp_path, "seq_classification")),
            f"paths.output_dir={out}",
            "data.batch_size=4",  # ~10 batches an epoch: step 4 is mid-epoch
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
    run(tmp_path, tmp_path / "run", "trainer.max_steps=2", "data.max_seq_length=24")
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert read_checkpoint(ckpt).hparams["max_seq_length"] == 24
    # `bert-lightning score`'s default
    assert load_finetuned(ckpt).max_seq_length == 24
