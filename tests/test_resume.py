import csv
import os
import signal

import lightning as L
import pytest
import torch

from bert_lightning.training.checkpoint_io import AtomicCheckpointIO
from bert_lightning.training.interrupt import Interrupted
from helpers import RESUMABLE, pretrain_tiny


class SignalAt(L.Callback):
    """Sends this process `sig` while optimizer step `step` + 1 runs, as Ctrl-C or a
    scheduler's SIGTERM would."""

    def __init__(self, step: int, sig: str):
        self.step, self.sig = step, sig

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), getattr(signal, self.sig))


def last_val_loss(out_dir):
    with open(out_dir / "metrics.csv") as f:
        return [float(r["val/loss"]) for r in csv.DictReader(f) if r["val/loss"]][-1]


@pytest.mark.slow
@pytest.mark.parametrize("workers,objective", [(0, "mlm"), (2, "mlm"), (0, "rtd")])
def test_killed_and_resumed_run_matches_the_uninterrupted_one(tmp_path, workers, objective):
    """Killed after step 4 of 8 (mid-epoch: an epoch is ~100 steps), resumed from last.ckpt:
    bitwise the weights of a run never killed. Dropout, shuffling and masks all continue, and
    under `objective=rtd` the generator's samples too."""
    w = (f"data.num_workers={workers}", f"objective={objective}")
    pretrain_tiny(tmp_path / "whole", *RESUMABLE, *w)
    with pytest.raises(RuntimeError, match="simulated crash"):
        pretrain_tiny(
            tmp_path / "killed",
            *RESUMABLE,
            *w,
            "+callbacks.crash._target_=probe.CrashAt",
            "+callbacks.crash.step=4",
        )
    last = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    state = torch.load(last, map_location="cpu", weights_only=True)
    assert state["global_step"] == 4 and state["epoch"] == 0
    pretrain_tiny(tmp_path / "resumed", *RESUMABLE, *w, f"ckpt_path={last}")

    whole = torch.load(tmp_path / "whole/checkpoints/last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=True)
    assert resumed["global_step"] == whole["global_step"] == 8
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name
    # the tokenizer comes from the checkpoint and the validation set is rebuilt identically
    tok = (tmp_path / "whole/tokenizer.json").read_text()
    assert (tmp_path / "resumed/tokenizer.json").read_text() == tok
    assert last_val_loss(tmp_path / "resumed") == last_val_loss(tmp_path / "whole")


@pytest.mark.slow
@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGUSR1"])
def test_an_interrupted_run_saves_its_step_and_resumes_bitwise(tmp_path, sig):
    """SIGINT, SIGTERM or SIGUSR1 (SLURM's warning) during step 3: the step completes,
    last.ckpt is written at it, the run stops with one line (and FAILED) saying how to resume,
    its exit code 128 + the signal's; resumed, bitwise the run never stopped."""
    pretrain_tiny(tmp_path / "whole", *RESUMABLE)
    stop_signals = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
    handlers = [signal.getsignal(s) for s in stop_signals]
    signal_at = ["+callbacks.signal._target_=test_resume.SignalAt", "+callbacks.signal.step=2"]
    with pytest.raises(Interrupted) as e:
        pretrain_tiny(tmp_path / "stopped", *RESUMABLE, *signal_at, f"+callbacks.signal.sig={sig}")
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert str(e.value) == (
        f"{sig} at step 3: {last} written; the same command with ckpt_path={last} continues the run"
    )
    assert (tmp_path / "stopped" / "FAILED").read_text() == f"Interrupted: {e.value}\n"
    assert e.value.exit_code == 128 + getattr(signal, sig)
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 3
    assert [signal.getsignal(s) for s in stop_signals] == handlers
    pretrain_tiny(tmp_path / "resumed", *RESUMABLE, f"ckpt_path={last}")
    whole = torch.load(tmp_path / "whole/checkpoints/last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=True)
    assert resumed["global_step"] == whole["global_step"] == 8
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name


def test_a_crash_while_saving_keeps_the_last_checkpoint(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def dies_midway(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt  # the process is stopped while writing

    monkeypatch.setattr(torch, "save", dies_midway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=True)["step"] == 1
    assert os.listdir(tmp_path) == ["last.ckpt"]  # no temporary left behind
    io.save_checkpoint({"step": 2}, path)
    assert torch.load(path, weights_only=True)["step"] == 2
