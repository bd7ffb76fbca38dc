"""A stop signal ends a run within seconds in every phase, not when the phase ends: a validation
of the fit is abandoned (the training state at its step saved), a data pass (tokenizing the
corpus) and what follows a fit (fine-tuning's test) are cut short. The exit code is 128 + the
signal's number and the last line says the run stopped on request. (Each stop resumed as the
run never stopped: tests/test_stop_resume.py.)"""

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from bert_lightning.config import bundled
from bert_lightning.data.corpus import iter_documents
from bert_lightning.signals import Interrupted
from helpers import (
    ROOT,
    bounded_output,
    session_ends,
    signal_group,
    subprocess_env,
    tiny_overrides,
    write_corpus,
)
from probe import SignalAtTest, SignalMidValidation  # noqa: F401 (the runs' callbacks, by name)

PROMPT = 10  # seconds from the signal to the run's exit
STOPPED = "stopped on request: "


def val_steps(out: Path) -> list[int]:
    with open(out / "metrics.csv", newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r.get("val/loss")]


def started(cmd: list[str], stderr) -> subprocess.Popen:
    """`cmd` in a session of its own (so that its processes can be counted), output piped."""
    return subprocess.Popen(
        cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=stderr, text=True,
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.slow
def test_a_sigterm_mid_validation_ends_the_run_within_seconds(tmp_path):
    """A validation of ~20,000 batches of one example (about a minute): SIGTERM at its 100th
    batch, to every process of the run, ends it within seconds, at step 2 saved, exit 143,
    its last line saying it stopped on request; the abandoned validation logs nothing."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl", 1000)
    slow_validation = ["data.batch_size=1", "data.val_docs=900", "data.max_eval_samples=20000"]
    stop = [f"+callbacks.stop._target_={__name__}.SignalMidValidation", "+callbacks.stop.batch=100"]
    args = tiny_overrides(out, *slow_validation, *stop, "+callbacks.stop.group=true")
    args += ["trainer.max_steps=4", "trainer.val_check_interval=2", "validate_before_fit=false"]
    cmd = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={out}"]
    p = started(cmd, stderr=subprocess.PIPE)
    _, stderr = bounded_output(p, 300)
    exited = time.time()
    assert session_ends(p.pid), f"a process of the run outlived its output: {stderr[-2000:]}"
    took = exited - float((out / "signalled").read_text())
    assert p.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert took < PROMPT, f"{took:.1f} s from SIGTERM to exit"
    last = out / "checkpoints" / "last.ckpt"
    line = stderr.strip().splitlines()[-1]
    assert line == (
        f"{STOPPED}SIGTERM at step 2: {last} written; the same command with ckpt_path={last} "
        "continues the run"
    )
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 2
    assert 2 not in val_steps(out)  # its partial metrics are not logged as a validation's


def big_corpus(path: Path, n_docs: int) -> None:
    """The bundled sample's documents over and over: a data pass of tens of seconds."""
    docs = list(iter_documents([bundled("c4_sample.jsonl")]))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n_docs):
            f.write(json.dumps({"text": docs[i % len(docs)], "url": f"u{i}"}) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("group", [False, True], ids=["main process", "every process"])
def test_a_sigterm_during_the_data_pass_ends_the_run_within_seconds(tmp_path, group):
    """Tokenizing 30,000 documents in 2 processes takes tens of seconds: SIGTERM 3 s into it,
    to the main process (as Docker and Kubernetes send it) or to all of them, ends the run
    within seconds with every process it started, exit 143, one line: nothing saved."""
    out = tmp_path / "run"
    big_corpus(out / "corpus.jsonl", 30_000)
    args = tiny_overrides(out, "data.num_proc=2", "validate_before_fit=false")
    cmd = [sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={out}"]
    p = started(cmd, stderr=subprocess.STDOUT)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(p.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not any("TPU available" in line for line in output):  # the trainer: setup next
            assert p.poll() is None and time.monotonic() < deadline, "".join(output)[-3000:]
            time.sleep(0.1)
        time.sleep(3)
        signalled = time.monotonic()
        os.killpg(p.pid, signal.SIGTERM) if group else os.kill(p.pid, signal.SIGTERM)
        p.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        ended = session_ends(p.pid)
        signal_group(p.pid, signal.SIGKILL)  # what is left of a failed test's run
        p.wait()
    reader.join(10)
    text = "".join(output)
    assert ended, f"a process of the run outlived it: {text[-2000:]}"
    assert "validation examples" not in text, "the data pass ended before the signal"
    assert p.returncode == 128 + signal.SIGTERM, text[-3000:]
    assert took < PROMPT, f"{took:.1f} s from SIGTERM to exit"
    last = text.strip().splitlines()[-1]  # also when the watchdog ended a clean-up stuck on
    assert last.startswith(f"{STOPPED}SIGTERM before training began: nothing saved")  # a pool


def test_a_sigterm_while_a_fine_tuning_run_tests_ends_it_at_once(tmp_path):
    """What follows a fit (fine-tuning's test of its best checkpoint, its baselines, the
    results) stops at the signal: Interrupted at once, saying training was saved, no
    results.json; the signal handlers are the process's own again."""
    from bert_lightning.config import compose
    from bert_lightning.training.finetune import finetune
    from finetune_fixtures import overrides, task_files, write_tokenizer

    write_tokenizer(tmp_path / "tokenizer.json")
    probe = [f"+callbacks.stop._target_={__name__}.SignalAtTest", "data.eval_batch_size=4"]
    task = "seq_classification"
    cfg = compose("finetune", overrides(tmp_path, task, *task_files(tmp_path, task), *probe))
    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)]
    with pytest.raises(Interrupted) as e:
        finetune(cfg)
    assert e.value.exit_code == 128 + signal.SIGTERM
    assert str(e.value).startswith("SIGTERM after training ended at step ")
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert str(e.value).endswith(
        f", its checkpoints written: what follows the fit did not run; the same command with "
        f"ckpt_path={last} runs it"
    )
    assert not (tmp_path / "run" / "results.json").exists()
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)] == (
        handlers
    )


def test_a_stop_signal_ends_a_command_saying_it_was_asked_for(monkeypatch, capsys):
    """An argparse command (evaluate, export, embed, ...) stopped by SIGTERM exits 143 with
    one line saying so; `serve` keeps the stop signals to itself (it drains)."""
    from bert_lightning import cli
    from bert_lightning.commands import report, serve
    from bert_lightning.signals import Stops

    def signalled(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends

    monkeypatch.setattr(report, "_main", signalled)
    with pytest.raises(SystemExit) as e:
        cli.main(["report", "brackets"])
    assert e.value.code == 143
    assert capsys.readouterr().err == "stopped on request: SIGTERM in report\n"
    handlers = []
    monkeypatch.setattr(
        serve, "_main", lambda args: handlers.append(signal.getsignal(signal.SIGTERM))
    )
    cli.main(["serve", "model"])
    assert not isinstance(handlers[0], Stops)


def test_a_stop_whose_clean_up_hangs_ends_after_the_grace_anyway(tmp_path):
    """A raised stop whose unwinding waits forever (a library's clean-up on a pool process
    the signal ended) ends after `GRACE` seconds: its child processes killed, exit 143, the
    stop's line."""
    from bert_lightning.signals import GRACE

    script = tmp_path / "stuck.py"
    script.write_text(
        "import os, signal, subprocess, sys, time\n"
        "from bert_lightning.signals import Interrupted, stops_on_signals\n"
        "with stops_on_signals('in a stuck clean-up'):\n"
        "    child = subprocess.Popen(['sleep', '60'])\n"
        "    print(child.pid, flush=True)\n"
        "    try:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "        time.sleep(60)\n"
        "    except Interrupted:\n"
        "        time.sleep(60)  # the clean-up that never ends\n"
    )
    start = time.monotonic()
    p = started([sys.executable, str(script)], stderr=subprocess.PIPE)
    out, err = p.communicate(timeout=60)
    assert time.monotonic() - start < GRACE + 10
    assert p.returncode == 128 + signal.SIGTERM
    assert err.endswith(
        f"stopped on request: SIGTERM in a stuck clean-up (ended {GRACE:.0f} s after it)\n"
    )
    child = int(out.split()[0])
    time.sleep(0.5)
    assert (
        not Path(f"/proc/{child}").exists()
        or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]
    )
