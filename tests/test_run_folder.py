"""What a run leaves in its folder and prints: `ckpt_path=` continues the run in its own folder
on its own schedule, a finished run resumed does nothing, a failed run leaves a `FAILED` marker
and nothing that looks usable, and a fresh run prints step lines and no warnings of ours."""

import csv
import logging
import os
import re
import runpy
import shutil
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from bert_lightning.config import compose
from bert_lightning.progress import eta_text
from bert_lightning.run_folder import resumed_run, run_dir
from bert_lightning.training.callbacks import StepProgressBar
from bert_lightning.training.finetune import finetune
from bert_lightning.training.pretrain import train
from finetune_fixtures import overrides as finetune_overrides
from finetune_fixtures import regression_rows, write_jsonl, write_tokenizer
from helpers import ROOT, cli_error, shipped, tiny_overrides, write_corpus

LR, WARMUP = 1e-3, 4


def expected_lr(step: int, total: int) -> float:
    """conf/optim/adamw.yaml's schedule: linear warmup, linear decay to 0 at `total`."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    return LR * max(0.0, (total - step) / (total - WARMUP))


def run(out, *extra):
    overrides = tiny_overrides(
        out, "trainer.val_check_interval=10", f"optim.warmup_steps={WARMUP}", *extra
    )
    return train(compose(overrides=overrides))


def rows(out):
    with open(out / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def snapshot(folder):
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
def test_a_continued_run_keeps_its_folder_and_its_schedule(tmp_path, caplog, capsys):
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    run(out, "trainer.max_steps=20")
    last = out / "checkpoints" / "last.ckpt"
    assert resumed_run(str(last)) == str(out)  # Hydra's run folder for the resume
    assert resumed_run(None) is None

    # past the original total (20) the rate stays 0, and a warning says how to stretch it
    with caplog.at_level(logging.WARNING):
        run(out, "trainer.max_steps=24", f"ckpt_path={last}")
    assert "optim.total_steps=24 stretches the decay" in caplog.text
    # a second continuation, with a longer schedule: redrawn from the current step
    run(out, "trainer.max_steps=28", "optim.total_steps=30", f"ckpt_path={last}")

    lrs = [(int(r["step"]), float(r["lr/model"])) for r in rows(out) if r["lr/model"]]
    assert [s for s, _ in lrs] == list(range(1, 29))  # every step once, in order, in one file
    for step, lr in lrs:  # the rate step k trained with, in step k's row (logged as float32)
        assert lr == pytest.approx(expected_lr(step - 1, 20 if step <= 24 else 30), rel=1e-6)
    train_steps = [int(r["step"]) for r in rows(out) if r["train/loss"]]
    assert train_steps == list(range(1, 29))
    # the validations before training, after 10 and after 20 steps (best-step10.ckpt, ...)
    assert [int(r["step"]) for r in rows(out) if r["val/loss"]] == [0, 10, 20]
    assert not (out / "FAILED").exists()

    # finished: one line, nothing written
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert run(out, "trainer.max_steps=28", f"ckpt_path={last}") is None
    assert capsys.readouterr().out == (
        f"{last} already reached max_steps=28: nothing to do "
        "(raise trainer.max_steps to continue)\n"
    )
    assert snapshot(tmp_path) == before


def test_an_empty_corpus_leaves_a_failed_marker_and_no_model_folder(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "corpus.jsonl").write_text("")
    with pytest.raises(ValueError, match="no documents with text in"):
        run(out)
    assert sorted(p.name for p in out.iterdir()) == ["FAILED", "corpus.jsonl"]
    reason = (out / "FAILED").read_text()
    assert reason.startswith("error: no documents with text in [") and reason.count("\n") == 1


@pytest.mark.slow
def test_a_fresh_run_prints_step_lines_and_no_warnings(tmp_path, capsys, caplog):
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    (out / ".hydra").mkdir()  # what Hydra writes into the run folder before the run starts
    (out / "train.log").write_text("")
    bar = ("trainer.enable_progress_bar=true", "trainer.enable_model_summary=true")
    with caplog.at_level(logging.INFO), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run(out, *bar, "trainer.val_check_interval=3", "callbacks.progress_bar.every=2")
    shown = [str(w.message) for w in caught]
    assert not [w for w in shown if "exists and is not empty" in w], shown
    assert not [w for w in shown if "set_vital" in w or "LeafSpec" in w], shown

    printed = capsys.readouterr().out.splitlines()  # pytest's stdout is no terminal
    steps = [line for line in printed if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/6", "2/6", "4/6", "6/6"]  # 1: it began
    assert all(" loss " in line and " eta " in line for line in steps), steps
    validations = [line for line in printed if line.startswith("validation at step ")]
    assert [line.split(":")[0] for line in validations] == [
        "validation at step 0",
        "validation at step 3",
        "validation at step 6",
    ]
    assert all("loss" in line and "ppl" in line for line in validations)
    assert all(re.search(r" ppl \S+ \(\d+\.\d s\)$", line) for line in validations), validations
    assert not any("Epoch" in line for line in printed)

    # the start line's size, against the count of the encoder's weights in its checkpoint
    state = torch.load(out / "checkpoints/last.ckpt", weights_only=True)["state_dict"]
    n = sum(t.numel() for k, t in state.items() if k.startswith("model.bert."))
    (start,) = [r.getMessage() for r in caplog.records if "the run starts from" in r.getMessage()]
    assert start.endswith(f"(2 layers, hidden 32, 2 heads, {n / 1e6:.3g}M encoder parameters)")
    assert f"{n / 1e6:.3g}" != f"{n / 1e6:.1f}"  # 0.1M: twice the tiny model's count

    summary = [r.getMessage() for r in caplog.records if "Trainable params" in r.getMessage()]
    assert len(summary) == 1 and "flops" not in summary[0].lower()
    assert "nsp_acc" not in summary[0]  # an MLM-only run has no NSP metrics
    assert "💡" not in caplog.text


def test_the_bar_switched_off_leaves_the_lines_on_a_terminal_too(tmp_path, capsys, monkeypatch):
    """`trainer.enable_progress_bar=false` (as scripts run fine-tuning) is not silence."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    run(out, "trainer.enable_progress_bar=false", "callbacks.progress_bar.every=3")
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in printed] == ["1/6", "3/6", "6/6"]


@pytest.mark.slow
def test_train_log_has_the_lines_the_console_shows_once(tmp_path, monkeypatch, capsys):
    """Off a terminal, the step and validation lines are printed (once: not also through
    Hydra's console handler) and are in the run's log, `train.log`, too."""
    monkeypatch.setattr(logging.root, "handlers", logging.root.handlers[:])  # Hydra sets its own
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    bar = ["trainer.enable_progress_bar=true", "callbacks.progress_bar.every=2"]
    monkeypatch.setattr(sys, "argv", ["train.py", *tiny_overrides(out, *bar)])
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")

    tag = "[bert_lightning.progress][INFO] - "  # a log record of ours (progress.to_log_files)
    console = capsys.readouterr().out.splitlines()
    assert not [line for line in console if tag in line]  # not twice on the console
    printed = [line for line in console if line.startswith(("step ", "validation at step "))]
    assert [line.split(" loss ")[0] for line in printed] == [
        "validation at step 0:",
        "step 1/6",
        "step 2/6",
        "validation at step 3:",
        "step 4/6",
        "step 6/6",
        "validation at step 6:",
    ]
    logged = [line.partition(tag)[2] for line in (out / "train.log").read_text().splitlines()]
    assert [line for line in logged if line.startswith(("step ", "validation at step "))] == printed


def test_the_bar_counts_the_steps_of_a_run_bound_by_epochs():
    """Fine-tuning runs by epochs (max_steps=-1): the total is what the epochs make."""
    assert StepProgressBar._total(SimpleNamespace(estimated_stepping_batches=30)) == 30
    assert StepProgressBar._total(SimpleNamespace(estimated_stepping_batches=float("inf"))) is None


def test_off_a_terminal_a_slow_run_prints_a_line_every_n_seconds(monkeypatch, capsys):
    """A step every 10 s with `every=1000` and `seconds=25`: a line at the first step (training
    has begun), then one 25 s or more after the last, at 40 s and 70 s, not silence until step
    1000."""
    from bert_lightning.training import callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    bar = instantiate(
        shipped("callbacks/_progress")["progress_bar"], every=1000, seconds=25, tty=False
    )
    metrics = {"train/loss": torch.tensor(2.5)}  # as logged: read when a line is printed
    trainer = SimpleNamespace(
        global_step=0, estimated_stepping_batches=100, callbacks=[], callback_metrics=metrics
    )
    bar.on_train_start(trainer, None)
    for step in range(1, 10):
        now[0], trainer.global_step = 10.0 * step, step
        bar.on_train_batch_end(trainer, None, None, None, step)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"step {s}/100 loss 2.5 eta {eta_text(10 * (100 - s))}" for s in (1, 4, 7)]


@pytest.mark.parametrize("tty", [False, True])
def test_a_long_validation_or_test_says_where_it_is_every_n_seconds(monkeypatch, capsys, tty):
    """A validation batch every 4 s, `seconds=15`: a line at 16 s, 32 s, ... with the batches
    done of all of its loaders', on a terminal too; the sanity check says nothing; a test
    likewise."""
    from bert_lightning.training import callbacks

    now = [0.0]
    monkeypatch.setattr(callbacks.time, "perf_counter", lambda: now[0])
    bar = instantiate(shipped("callbacks/_progress")["progress_bar"], seconds=15, tty=tty)
    trainer = SimpleNamespace(
        global_step=6, sanity_checking=False, num_val_batches=[6, 4], num_test_batches=[9]
    )
    for start, end in [("on_validation_start", "on_validation_batch_end"),
                       ("on_test_start", "on_test_batch_end")]:  # fmt: skip
        now[0] = 0.0
        getattr(bar, start)(trainer, None)
        for i in range(1, 10):
            now[0] = 4.0 * i
            getattr(bar, end)(trainer, None, None, None, i - 1)
    trainer.sanity_checking = True
    bar.on_validation_start(trainer, None)
    now[0] = 100.0
    bar.on_validation_batch_end(trainer, None, None, None, 0)
    assert capsys.readouterr().out.splitlines() == [
        "validation at step 6: batch 4/10 (16 s)",
        "validation at step 6: batch 8/10 (32 s)",
        "test: batch 4/9 (16 s)",
        "test: batch 8/9 (32 s)",
    ]


@pytest.mark.slow
def test_a_moved_run_folder_continues_where_it_now_is(tmp_path, caplog):
    """The checkpoint names the folder it was written in; moved, the run continues in the new
    one: `last.ckpt` is the newest (no `last-v1.ckpt`), one best checkpoint, the log says so."""
    old, new = tmp_path / "old", tmp_path / "new"
    write_corpus(old / "corpus.jsonl")
    run(old, "trainer.max_steps=20")
    shutil.move(old, new)
    with caplog.at_level(logging.INFO):
        run(new, "trainer.max_steps=30", f"ckpt_path={new / 'checkpoints/last.ckpt'}")
    assert f"the run moved from {old}: it continues in {new}" in caplog.text
    names = sorted(p.name for p in (new / "checkpoints").iterdir())
    assert names[-1] == "last.ckpt" and len(names) == 2 and names[0].startswith("best-step")
    last = torch.load(new / "checkpoints/last.ckpt", weights_only=True, map_location="cpu")
    assert last["global_step"] == 30
    assert not old.exists()


@pytest.mark.slow
def test_paths_output_dir_holds_the_whole_run(tmp_path):
    """`paths.output_dir=X` on the command line: Hydra's record and the log go to X beside the
    checkpoints and metrics, nothing to the dated default folder."""
    from bert_lightning.cli import main

    out, logs = tmp_path / "mine", tmp_path / "logs"
    write_corpus(tmp_path / "corpus.jsonl")
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("paths.output_dir")]
    overrides = [o for o in overrides if not o.startswith("trainer.max_steps")]
    last, further = out / "checkpoints" / "last.ckpt", tmp_path / "further"
    handlers = logging.root.handlers[:]  # an in-process Hydra run points them at this test
    try:
        main(
            [
                "pretrain",
                *overrides,
                "trainer.max_steps=4",
                f"paths.output_dir={out}",
                f"paths.log_dir={logs}",
            ]
        )
        # continued into another folder: that folder gets its own record
        main(
            [
                "pretrain",
                *overrides,
                "trainer.max_steps=6",
                f"ckpt_path={last}",
                f"paths.output_dir={further}",
                f"paths.log_dir={logs}",
            ]
        )
    finally:
        logging.root.handlers[:] = handlers
    assert (out / ".hydra" / "overrides.yaml").is_file() and list(out.glob("*.log"))
    assert last.is_file() and (out / "metrics.csv").is_file()
    assert (further / ".hydra" / "overrides.yaml").is_file() and list(further.glob("*.log"))
    assert (further / "checkpoints" / "last.ckpt").is_file()
    assert not logs.exists()


LINKED = (  # the refusal's line after `error: <link>: `
    "a symlink (to {}) in the run folder this resume writes into; remove it, or continue the "
    "run in another folder with paths.output_dir=NEW"
)


def tiny_run(tmp_path, entry):
    """A 2-step run of `entry` (pretrain | finetune) in tmp_path/run, in process: the command
    line that resumes it in its own folder."""
    out = tmp_path / "run"
    if entry == "pretrain":
        write_corpus(out / "corpus.jsonl", 20)
        argv = tiny_overrides(out)
        train(compose(overrides=[*argv, "trainer.max_steps=2"]))
    else:
        write_tokenizer(tmp_path / "tokenizer.json")
        train_file = write_jsonl(tmp_path / "train.jsonl", regression_rows(48))
        argv = finetune_overrides(
            tmp_path, "regression", f"task.train_file={train_file}", "trainer.max_epochs=-1"
        )
        finetune(compose("finetune", [*argv, "trainer.max_steps=2"]))
    last = out / "checkpoints" / "last.ckpt"
    # in its own folder: the one Hydra runs in, as `ckpt_path=` alone makes it
    argv = [o for o in argv if not o.startswith("paths.output_dir=")]
    return out, [entry, *argv, f"ckpt_path={last}", "trainer.max_steps=3"]


@pytest.mark.parametrize("entry", ["pretrain", "finetune"])
def test_a_resume_into_a_folder_holding_symlinks_is_refused_untouched(tmp_path, capsys, entry):
    """A downloaded run folder is data: its `hparams.yaml` (the CSV logger rewrites it) and its
    log (Hydra appends to it) planted as links to files elsewhere are neither written through
    nor followed; the resume is one line, before anything is written."""
    out, resume = tiny_run(tmp_path, entry)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = sorted(["hparams.yaml", f"{entry}.log"])  # the first is named
    for name in planted:
        (elsewhere / name).write_text("mine\n")
        (out / name).unlink(missing_ok=True)
        (out / name).symlink_to(Path("..", "elsewhere", name))
    before = snapshot(tmp_path)
    err = cli_error(capsys, *resume)
    assert err == f"error: {out / planted[0]}: {LINKED.format(elsewhere / planted[0])}"
    assert snapshot(tmp_path) == before
    assert {p.read_text() for p in elsewhere.iterdir()} == {"mine\n"}
    assert not (out / "FAILED").exists()


@pytest.mark.parametrize("link", [".", "checkpoints", ".hydra/hydra.yaml", "train.log"])
def test_a_symlink_anywhere_in_the_run_folder_refuses_its_resume(tmp_path, capsys, link):
    """The folder itself, a folder in it, a file at any depth, each moved elsewhere and linked
    to: the resume is refused (one line, exit 2) as Hydra picks its folder, before it writes
    there; continued into another folder (`paths.output_dir=`), the run is not refused."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").write_bytes(b"")
    (run / ".hydra").mkdir()
    (run / ".hydra" / "hydra.yaml").write_text("")
    (run / "train.log").write_text("")
    moved = run / link  # moved elsewhere, a link in its place
    moved.rename(elsewhere)
    moved.symlink_to(elsewhere)
    last = str(run / "checkpoints" / "last.ckpt")
    with pytest.raises(SystemExit) as e:
        run_dir(last, "train", [], "default")
    assert e.value.code == 2
    assert capsys.readouterr().err == f"error: {moved}: {LINKED.format(elsewhere)}\n"
    assert run_dir(last, "train", [f"paths.output_dir={tmp_path / 'new'}"], "d") == str(
        tmp_path / "new"
    )


def test_a_hard_link_in_a_folder_a_run_writes_into_is_refused(tmp_path):
    """A hard link shares the file it names: an append to `metrics.csv` would reach it."""
    from bert_lightning.errors import UserError
    from bert_lightning.run_folder import refuse_links

    outside = tmp_path / "outside.csv"
    outside.write_text("theirs\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.csv").hardlink_to(outside)
    with pytest.raises(UserError) as e:
        refuse_links(run)
    assert str(e.value) == (
        f"{run / 'metrics.csv'}: a hard link in the run folder this resume writes into; remove "
        "it, or continue the run in another folder with paths.output_dir=NEW"
    )


def test_a_fifo_in_a_folder_a_run_reads_is_refused(tmp_path):
    """A FIFO (a tar can hold one) named `hparams.yaml` or `last.ckpt` would keep its reader
    waiting forever."""
    from bert_lightning.errors import UserError
    from bert_lightning.run_folder import refuse_links

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    os.mkfifo(run / "checkpoints" / "last.ckpt")
    with pytest.raises(UserError) as e:
        refuse_links(run)
    assert str(e.value) == (
        f"{run / 'checkpoints' / 'last.ckpt'}: not a regular file (a reader would wait) in the "
        "run folder this resume writes into; remove it, or continue the run in another folder "
        "with paths.output_dir=NEW"
    )
