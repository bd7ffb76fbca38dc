"""Every way a run ends, as a process manager sees it: each entry point runs as a subprocess in
a session of its own, and must exit with the expected code and leave no process of its group
behind (loader workers included), whether it ends by steps, epochs, its time budget, a signal,
a crash of its main process or an error."""

import csv
import signal
import sys
from pathlib import Path

import lightning as L
import pytest
import torch

from bert_lightning.data.corpus import iter_documents
from finetune_fixtures import overrides as finetune_overrides
from finetune_fixtures import task_files, write_tokenizer
from helpers import (
    ROOT,
    SAMPLE,
    c4_shard,
    run_in_session,
    subprocess_env,
    tiny_overrides,
    write_corpus,
)

BOUND = 300  # seconds within which a run and every process it started must be gone
WORKERS = ["data.num_workers=2"]
BUDGET = ["trainer.max_steps=-1", "trainer.max_time=00:00:00:03"]


class FailAt(L.Callback):
    """An error (not a user's mistake) raised as optimizer step `step` + 1 starts."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"a fault at step {self.step}")


def at_step_2(sig: str, group: bool = True) -> list[str]:
    """`sig` as step 3 starts: to every process of the run (as Ctrl-C in a terminal and SLURM
    send it), or to the main process alone."""
    cb = "+callbacks.stop"
    return [f"{cb}._target_=probe.SignalRank", f"{cb}.step=2", f"{cb}.rank=0"] + [
        f"{cb}.sig={sig}",
        f"{cb}.group={group}",
    ]


def pretrain(out: Path, *extra: str) -> tuple[int, str]:
    write_corpus(out / "corpus.jsonl", 60)
    cmd = [sys.executable, str(ROOT / "train.py"), *tiny_overrides(out, *extra)]
    r = run_in_session([*cmd, f"hydra.run.dir={out}"], subprocess_env(), BOUND)
    return r.returncode, r.stderr


def last_step(out: Path) -> int:
    return torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]


FAIL = ["+callbacks.fail._target_=test_process_ends.FailAt", "+callbacks.fail.step=2"]
ENDS = {  # how a pretraining run with 2 loader workers ends -> its exit code
    "steps": ([], 0),
    "epochs": (["trainer.max_steps=-1", "trainer.max_epochs=1"], 0),
    "time budget": (BUDGET, 0),
    "SIGINT": (at_step_2("SIGINT"), 128 + signal.SIGINT),
    "SIGTERM": (at_step_2("SIGTERM"), 128 + signal.SIGTERM),
    "SIGUSR1": (at_step_2("SIGUSR1"), 128 + signal.SIGUSR1),
    "SIGKILL to the main process": (at_step_2("SIGKILL", group=False), -signal.SIGKILL),
    "an error": (
        ["+callbacks.fail._target_=test_process_ends.FailAt", "+callbacks.fail.step=2"],
        1,
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("end", ENDS)
def test_a_pretraining_run_with_loader_workers_ends_with_all_its_processes(tmp_path, end):
    extra, code = ENDS[end]
    rc, stderr = pretrain(tmp_path, *WORKERS, *extra)
    assert rc == code, stderr[-3000:]
    if code == 0:  # last.ckpt holds the step the run ended on
        assert last_step(tmp_path) > 0


@pytest.mark.slow
def test_a_time_budgeted_run_saves_its_final_step(tmp_path):
    """The budget's last step is in last.ckpt, though no checkpoint falls due at it."""
    rc, stderr = pretrain(tmp_path, *WORKERS, *BUDGET, "trainer.val_check_interval=1000000")
    assert rc == 0, stderr[-3000:]
    with open(tmp_path / "metrics.csv", newline="") as f:
        steps = max(int(r["step"]) for r in csv.DictReader(f) if r.get("step"))
    assert last_step(tmp_path) == steps


@pytest.mark.slow
def test_a_signal_during_validation_stops_the_run_as_the_validation_ends(tmp_path):
    """Not acted on before, a stop signal in a validation of the fit let the run go on."""
    stop = ["+callbacks.stop._target_=probe.SignalAtValidation", "+callbacks.stop.sig=SIGTERM"]
    rc, stderr = pretrain(tmp_path, *WORKERS, *stop, "trainer.val_check_interval=3")
    assert rc == 128 + signal.SIGTERM, stderr[-3000:]
    assert "SIGTERM at step 3: " in stderr and last_step(tmp_path) == 3, stderr[-3000:]


@pytest.mark.slow
def test_a_time_budgeted_nsp_run_with_loader_workers_ends(tmp_path):
    rc, stderr = pretrain(tmp_path, "data=c4_nsp", *WORKERS, *BUDGET)
    assert rc == 0, stderr[-3000:]


@pytest.mark.slow
def test_a_time_budgeted_streaming_run_with_loader_workers_ends(tmp_path):
    docs = list(iter_documents([SAMPLE]))
    train = c4_shard(tmp_path / "c4-train.00000.json.gz", docs[:80])
    val = c4_shard(tmp_path / "c4-validation.00000.json.gz", docs[200:220])
    stream = ["data=c4_hub", "data.train_files=null", "data.cache_dir=null", "data.path=json"]
    stream += ["data.name=null"]
    stream += [f"+data.data_files.train={train}", f"+data.data_files.validation={val}"]
    rc, stderr = pretrain(tmp_path, *stream, *WORKERS, *BUDGET)
    assert rc == 0, stderr[-3000:]


FINETUNE_ENDS = {  # how a fine-tuning run ends -> its exit code
    "epochs": ([], 0),
    "early stopping": (["trainer.max_epochs=20", "callbacks.early_stopping.patience=0"], 0),
    "time budget": (["trainer.max_epochs=-1", "trainer.max_time=00:00:00:03"], 0),
    "SIGTERM": (at_step_2("SIGTERM"), 128 + signal.SIGTERM),
}


@pytest.mark.slow
@pytest.mark.parametrize("end", FINETUNE_ENDS)
def test_a_fine_tuning_run_ends_with_all_its_processes(tmp_path, end):
    extra, code = FINETUNE_ENDS[end]
    write_tokenizer(tmp_path / "tokenizer.json")
    task = "seq_classification"
    args = finetune_overrides(tmp_path, task, *task_files(tmp_path, task), *extra)
    cmd = [sys.executable, str(ROOT / "finetune.py"), *args, f"hydra.run.dir={tmp_path / 'run'}"]
    r = run_in_session(cmd, subprocess_env(), BOUND)
    assert r.returncode == code, r.stderr[-3000:]


@pytest.mark.slow
def test_a_run_past_its_bound_fails_with_the_python_stacks_of_every_process_of_its_group():
    """A hang is told from slowness the first time it happens: where each process waits."""
    child = "import time\ndef napping_child():\n    time.sleep(60)\nnapping_child()"
    parent = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {child!r}])"
    parent += "\ndef napping_parent():\n    time.sleep(60)\nnapping_parent()"
    with pytest.raises(pytest.fail.Exception) as failed:
        run_in_session([sys.executable, "-c", parent], subprocess_env(), 3)
    message = str(failed.value)
    assert "still running after 3 s" in message
    assert message.count("Fatal Python error: Aborted") == 2, message
    assert "in napping_parent" in message and "in napping_child" in message, message
