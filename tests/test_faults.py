"""Faults that long runs meet, each made on purpose: a DDP rank killed, a preemption signal
reaching one rank of two, a checkpoint cut short, a disk that fills while a checkpoint is
written. Each must end the run in bounded time with a non-zero code and leave what was saved
intact; the run resumed from it is bitwise the run never interrupted."""

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from bert_lightning.errors import UserError
from helpers import (
    RESUMABLE,
    ROOT,
    pretrain_tiny,
    run_in_session,
    subprocess_env,
    tiny_overrides,
    write_corpus,
)

DDP_RUN = [  # 2 CPU processes, 8 steps, last.ckpt every 4
    "trainer=ddp_sim",
    "data.batch_size=4",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "callbacks.model_checkpoint.every_n_train_steps=4",
]
BOUND = 300  # seconds within which every process of a failed run must be gone


def train_ddp(out: Path, *extra: str) -> subprocess.CompletedProcess:
    """train.py with 2 DDP processes in a session of its own: returns once every process that
    holds its output is gone (Lightning's launcher starts rank 1 as a child of rank 0)."""
    write_corpus(out / "corpus.jsonl", 60)
    cmd = [sys.executable, str(ROOT / "train.py"), *tiny_overrides(out, *DDP_RUN, *extra)]
    return run_in_session([*cmd, f"hydra.run.dir={out}"], subprocess_env(), BOUND)


def weights(ckpt: Path) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert state["global_step"] == 8
    return state["state_dict"]


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        assert torch.equal(tensor, b[name]), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("ddp") / "whole"
    r = train_ddp(out)
    assert r.returncode == 0, r.stderr[-3000:]
    return weights(out / "checkpoints" / "last.ckpt")


def resumed(out: Path, last: Path, *extra: str) -> dict[str, torch.Tensor]:
    """The weights at step 8 of the run continued from `last`."""
    r = train_ddp(out, f"ckpt_path={last}", *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    return weights(out / "checkpoints" / "last.ckpt")


def kill_rank(out: Path, rank: int) -> Path:
    """SIGKILL to `rank` at step 7 (last.ckpt holds step 4): the other rank's next collective
    fails (gloo: connection reset), so every process exits, non-zero, within the bound."""
    kill = ["+callbacks.kill._target_=probe.SignalRank", "+callbacks.kill.step=6"]
    r = train_ddp(out, *kill, f"+callbacks.kill.rank={rank}", "+callbacks.kill.sig=SIGKILL")
    assert r.returncode != 0
    last = out / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 4
    return last


@pytest.mark.slow
def test_killing_rank_0_ends_rank_1(tmp_path):
    kill_rank(tmp_path / "killed", 0)


@pytest.mark.slow
def test_killing_rank_1_ends_rank_0_and_the_run_resumes_bitwise(tmp_path, uninterrupted):
    last = kill_rank(tmp_path / "killed", 1)
    assert_bitwise(resumed(tmp_path / "resumed", last), uninterrupted)


def preempt(out: Path, group: bool, workers: int) -> Path:
    """SLURM's SIGUSR1 during step 3, sent by rank 1 to itself alone or (`group`) to every
    process of the run, loader workers included: both ranks finish the step, agree on it,
    save last.ckpt there together and exit with 128 + SIGUSR1 and one line."""
    usr1 = ["+callbacks.usr1._target_=probe.SignalRank", "+callbacks.usr1.step=2"]
    usr1 += ["+callbacks.usr1.rank=1", "+callbacks.usr1.sig=SIGUSR1"]
    r = train_ddp(out, *usr1, f"+callbacks.usr1.group={group}", f"data.num_workers={workers}")
    last = out / "checkpoints" / "last.ckpt"
    line = f"SIGUSR1 at step 3: {last} written; the same command with ckpt_path={last} continues"
    assert r.returncode == 128 + signal.SIGUSR1, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == f"stopped on request: {line} the run"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 3
    return last


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_both_at_one_step(tmp_path):
    """Rank 0 never receives the signal: it stops with rank 1 through their agreement."""
    preempt(tmp_path / "stopped", group=False, workers=0)


@pytest.mark.slow
def test_a_signal_to_every_process_is_saved_and_resumes_bitwise(tmp_path, uninterrupted):
    """The loader workers, signalled too, leave the signal to their rank."""
    last = preempt(tmp_path / "stopped", group=True, workers=2)
    assert_bitwise(resumed(tmp_path / "resumed", last, "data.num_workers=2"), uninterrupted)


@pytest.mark.slow
def test_a_truncated_last_ckpt_names_the_newest_intact_one(tmp_path):
    """last.ckpt cut short (a copy that did not finish): resuming from it is one line naming
    the newest checkpoint beside it that reads whole, and writes nothing."""
    pretrain_tiny(tmp_path / "run", *RESUMABLE)
    folder = tmp_path / "run" / "checkpoints"
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])
    best = next(folder.glob("best-step*.ckpt"))
    step = torch.load(best, map_location="cpu", weights_only=True)["global_step"]
    before = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    with pytest.raises(UserError) as e:
        pretrain_tiny(tmp_path / "run", *RESUMABLE, f"ckpt_path={last}")
    assert str(e.value).startswith(f"{last}: not a checkpoint (torch.load could not read it: ")
    assert str(e.value).endswith(
        f"); the newest intact checkpoint beside it is {best} (step {step}): "
        f"ckpt_path={best} continues from there"
    )
    assert "\n" not in str(e.value)
    after = {p: p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file()}
    assert after == before


class DiskFullFrom(L.Callback):
    """From optimizer step `step` on, `torch.save` writes half of what it is given, then
    fails as a full disk does (ENOSPC)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != self.step or getattr(torch.save, "full", False):
            return
        save = torch.save

        def full_disk(obj, f, *args, **kwargs):
            save(obj, f, *args, **kwargs)
            f.truncate(f.tell() // 2)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        full_disk.full = True
        torch.save = full_disk


@pytest.mark.slow
def test_a_full_disk_while_saving_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The disk fills while the step-8 checkpoints are written: one line naming the file,
    last.ckpt still the whole step-4 one, no partial file left; the run continues from it."""
    monkeypatch.setattr(torch, "save", torch.save)  # the callback's patch is undone after
    out = tmp_path / "run"
    with pytest.raises(UserError) as e:
        pretrain_tiny(
            out,
            *RESUMABLE,
            "+callbacks.disk._target_=test_faults.DiskFullFrom",
            "+callbacks.disk.step=5",
        )
    folder = out / "checkpoints"
    assert str(e.value).startswith(f"{folder}/")
    assert str(e.value).endswith(".ckpt: cannot write it (No space left on device)")
    assert (out / "FAILED").read_text() == f"error: {e.value}\n"
    state = torch.load(folder / "last.ckpt", map_location="cpu", weights_only=True)
    assert state["global_step"] == 4
    assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary file
    monkeypatch.undo()
    pretrain_tiny(tmp_path / "resumed", *RESUMABLE, f"ckpt_path={folder / 'last.ckpt'}")
    weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt")  # at step 8


@pytest.mark.parametrize("rc, requeued", [(138, True), (143, True), (1, False), (0, False)])
def test_the_slurm_script_requeues_a_stopped_run_and_resumes_it(tmp_path, rc, requeued):
    """docs/slurm_pretrain.sbatch with `srun` and `scontrol` stood in for: a run that exits
    138 or 143 (saved and stopped by its signal) is requeued, a crash or a finished run is
    not; the requeued job passes ckpt_path= its own last.ckpt, and the exit code is the run's."""
    bin_dir, work = tmp_path / "bin", tmp_path / "work"
    bin_dir.mkdir()
    (work / ".venv" / "bin").mkdir(parents=True)
    (work / ".venv" / "bin" / "activate").write_text("")
    calls = tmp_path / "calls"
    for name, code in (("srun", rc), ("scontrol", 0)):
        stub = bin_dir / name
        stub.write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\nexit {code}\n')
        stub.chmod(0o755)
    slurm = {"SLURM_JOB_ID": "77", "SLURM_NNODES": "4", "SLURM_NTASKS_PER_NODE": "8"}
    environ = {**os.environ, **slurm, "SLURM_CPUS_PER_TASK": "12"}
    environ["PATH"] = f"{bin_dir}{os.pathsep}{environ['PATH']}"
    script = ROOT / "docs" / "slurm_pretrain.sbatch"
    for attempt in range(2):
        r = subprocess.run(["bash", str(script)], cwd=work, env=environ, capture_output=True)
        assert r.returncode == rc, r.stderr
        lines = calls.read_text().splitlines()
        assert lines[0].startswith("srun --kill-on-bad-exit=1 python train.py ")
        resume = "ckpt_path=outputs/pretrain/slurm-77/checkpoints/last.ckpt"
        assert lines[0].endswith(resume) == (attempt == 1)
        assert lines[1:] == (["scontrol requeue 77"] if requeued else [])
        calls.unlink()
        last = work / "outputs/pretrain/slurm-77/checkpoints/last.ckpt"
        last.parent.mkdir(parents=True, exist_ok=True)
        last.write_bytes(b"")
