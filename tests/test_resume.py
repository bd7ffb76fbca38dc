import csv
import json
import os
import shutil
import signal
from types import SimpleNamespace

import lightning as L
import pytest
import torch
import yaml

from bert_lightning.checkpoint import DATA_RECORD, read_checkpoint
from bert_lightning.cli import main
from bert_lightning.config import bundled, compose
from bert_lightning.data.corpus import iter_documents
from bert_lightning.errors import UserError
from bert_lightning.training.callbacks import EarlyStopping
from bert_lightning.training.checkpoint_io import AtomicCheckpointIO
from bert_lightning.training.finetune import finetune
from bert_lightning.training.interrupt import Interrupted
from bert_lightning.training.pretrain import train
from bert_lightning.training.resume import check_same_data
from finetune_fixtures import (
    overrides,
    regression_rows,
    write_hf_folder,
    write_jsonl,
    write_our_ckpt,
    write_tokenizer,
)
from helpers import RESUMABLE, pretrain_tiny, tiny_overrides, write_corpus


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
    assert (tmp_path / "stopped" / "FAILED").read_text() == f"stopped on request: {e.value}\n"
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


def write_text_corpus(path, docs) -> str:
    """C4 documents as a .txt file: a block each (its paragraphs on lines of their own)."""
    path.write_text("\n\n".join(docs) + "\n")
    return str(path)


def sample_docs(start: int, stop: int) -> list[str]:
    return list(iter_documents([bundled("c4_sample.jsonl")]))[start:stop]


def evaluated_loss(tmp_path, ckpt, val) -> dict:
    out = tmp_path / "eval.json"
    main(["evaluate", str(ckpt), str(val), "--cache-dir", str(tmp_path / "c"), "--json", str(out)])
    return json.loads(out.read_text())["metrics"]


@pytest.mark.slow
def test_evaluate_reads_text_files_as_the_run_did(tmp_path):
    """Row 4 (a): a run with `data.text_unit=line` (a document, here an example, per line) is
    evaluated per line too, not per block: its own validation file gives its last validation
    loss."""
    out = tmp_path / "run"
    train_txt = write_text_corpus(tmp_path / "train.txt", sample_docs(0, 60))
    val = write_text_corpus(tmp_path / "val.txt", sample_docs(100, 110))
    cfg = compose(
        overrides=tiny_overrides(
            out, "data=text", f"data.train_files={train_txt}", f"data.val_files={val}",
            "data.text_unit=line", "data.packing=document",
        )
    )  # fmt: skip
    val_loss = train(cfg)
    got = evaluated_loss(tmp_path, out / "checkpoints" / "last.ckpt", val)
    assert got["loss"] == pytest.approx(val_loss, abs=1e-5)


@pytest.mark.slow
def test_evaluate_scores_an_nsp_run_on_its_pairs(tmp_path):
    """Row 4 (b): an NSP run is evaluated on sentence pairs with its loss (MLM + NSP), as it
    validated, not as MLM on single texts."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl", 60)
    val = tmp_path / "val.jsonl"
    val.write_text("".join(json.dumps({"text": d}) + "\n" for d in sample_docs(100, 120)))
    val_loss = train(compose(overrides=tiny_overrides(out, "data=c4_nsp", f"data.val_files={val}")))
    got = evaluated_loss(tmp_path, out / "checkpoints" / "last.ckpt", val)
    assert got["loss"] == pytest.approx(val_loss, abs=1e-5)
    assert got["loss"] == pytest.approx(got["mlm_loss"] + got["nsp_loss"], abs=1e-5)


def finetune_regression(tmp_path, *extra):
    """A debug=tiny regression run on tmp_path/train.jsonl (as it is), writing into tmp_path/run,
    with last.ckpt at step 4."""
    cfg = compose(
        "finetune",
        overrides(
            tmp_path, "regression", f"task.train_file={tmp_path / 'train.jsonl'}",
            "trainer.max_steps=4", "trainer.max_epochs=-1",
            "callbacks.model_checkpoint.every_n_train_steps=4", *extra,
        ),
    )  # fmt: skip
    return finetune(cfg)


TARGET_SCALE = ("target_mean", "target_std")


def write_targets(path, scale: float) -> None:
    """regression_rows' 48 rows with their targets times `scale` (dollars -> cents: 100)."""
    write_jsonl(path, [r | {"target": r["target"] * scale} for r in regression_rows(48)])


def rescaled_resume(tmp_path, *extra):
    """A regression run fine-tuned on targets in dollars for 4 steps: (its last.ckpt, what a
    resume on the same file in cents names as changed, that resume to step 6 with `extra`)."""
    write_tokenizer(tmp_path / "tokenizer.json")
    write_targets(tmp_path / "train.jsonl", 1.0)
    finetune_regression(tmp_path)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    before = os.path.getsize(tmp_path / "train.jsonl")
    write_targets(tmp_path / "train.jsonl", 100.0)
    after = os.path.getsize(tmp_path / "train.jsonl")
    task = read_checkpoint(last).hparams["task"]  # the scale in dollars; in cents: x 100
    scale = "; ".join(f"task.{k} {task[k]:.6g} -> {task[k] * 100:.6g}" for k in TARGET_SCALE)
    changed = f"task.train_file: train.jsonl changed ({before:,} -> {after:,} bytes); {scale}"
    more = ("trainer.max_steps=6", f"ckpt_path={last}", *extra)
    return last, changed, lambda: finetune_regression(tmp_path, *more)


@pytest.mark.slow
def test_a_finetuning_resume_on_rescaled_targets_is_refused(tmp_path):
    """Row 10: targets changed from dollars to cents between a run and its resume: refused in
    one line naming the file and the target scale, and the run left as it was."""
    last, changed, resume = rescaled_resume(tmp_path)
    ckpt = last.read_bytes()
    with pytest.raises(UserError) as e:
        resume()
    assert str(e.value) == (
        f"{last}: trained on other data: {changed}; resume_with_new_data=true continues on these"
    )
    assert last.read_bytes() == ckpt and not (tmp_path / "run" / "FAILED").exists()


@pytest.mark.slow
def test_resume_with_new_data_trains_on_them_and_says_what_changed(tmp_path, caplog):
    """`resume_with_new_data=true`: the run continues on the cents, its log names what changed,
    and its checkpoints record the new data (the target scale its head now predicts in)."""
    last, changed, resume = rescaled_resume(tmp_path, "resume_with_new_data=true")
    first = read_checkpoint(last).hparams["task"]
    with caplog.at_level("WARNING", logger="bert_lightning.training.resume"):
        assert resume()["steps"] == 6
    assert (
        f"{last}: continuing on other data (resume_with_new_data=true): {changed}"
        in caplog.messages
    )
    now = read_checkpoint(last).hparams["task"]
    assert [now[k] for k in TARGET_SCALE] == pytest.approx([first[k] * 100 for k in TARGET_SCALE])
    write_targets(tmp_path / "train.jsonl", 100.0)  # as it is: written again, the same rows
    caplog.clear()
    finetune_regression(tmp_path, f"ckpt_path={last}", "trainer.max_steps=8")  # its data now
    assert not [m for m in caplog.messages if "other data" in m]


@pytest.mark.slow
def test_a_pretraining_resume_on_another_corpus_is_refused(tmp_path):
    """Row 10: a pretraining run continued on another corpus (and so another validation set,
    held out of it) is refused, naming the files; `resume_with_new_data=true` trains on it."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    train(compose(overrides=tiny_overrides(out, "trainer.max_steps=3")))
    last = out / "checkpoints" / "last.ckpt"
    other = write_corpus(tmp_path / "other.jsonl", 50)
    again = tiny_overrides(out, f"data.train_files={other}", f"ckpt_path={last}")
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    with pytest.raises(UserError) as e:
        train(compose(overrides=again))
    assert {p: p.stat().st_mtime_ns for p in written} == written  # nothing rewritten
    assert str(e.value) == (
        f"{last}: trained on other data: data.train_files: corpus.jsonl no longer read, "
        "other.jsonl read now; resume_with_new_data=true continues on these"
    )
    assert train(compose(overrides=[*again, "resume_with_new_data=true"])) is not None
    assert torch.load(last, weights_only=True)["global_step"] == 6


def test_a_pretraining_checkpoint_keeps_one_data_record_and_a_resume_keeps_its_batches(tmp_path):
    """The data module's record is the checkpoint's one data record (no copy among the
    hyper-parameters): the module that made the examples and the batch size whose batches'
    seeds mask the validation rows are in it, so that a resume with another batch size (its
    validations masked otherwise than the checkpoints it compares them with) is refused."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    train(compose(overrides=tiny_overrides(out, "trainer.max_steps=2", "data.batch_size=4")))
    last = out / "checkpoints" / "last.ckpt"
    raw = torch.load(last, weights_only=True)
    assert "data" not in raw["hyper_parameters"]
    record = raw["data_record"]
    assert record["data._target_"] == "bert_lightning.data.pretraining.PretrainDataModule"
    assert record["data.batch_size"] == 4 and record["data.seed"] == 1234
    again = tiny_overrides(out, "trainer.max_steps=4", "data.batch_size=8", f"ckpt_path={last}")
    with pytest.raises(UserError) as e:
        train(compose(overrides=again))
    assert str(e.value) == (
        f"{last}: trained on other data: data.batch_size 4 -> 8; resume_with_new_data=true "
        "continues on these"
    )


def test_a_resumed_runs_config_record_names_the_optimizer_that_trains(tmp_path):
    """config_resolved.yaml records the optimizer that trained (the checkpoint's, which a
    resume keeps), not the config's values the resume left unsaid."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    train(compose(overrides=tiny_overrides(out, "trainer.max_steps=2", "optim.lr=5e-3")))
    last = out / "checkpoints" / "last.ckpt"
    train(compose(overrides=tiny_overrides(out, "trainer.max_steps=4", f"ckpt_path={last}")))
    trained = torch.load(last, weights_only=True)["hyper_parameters"]["optim"]
    recorded = yaml.safe_load((out / "config_resolved.yaml").read_text())["optim"]
    assert recorded == trained and recorded["lr"] == 5e-3


def test_a_checkpoint_without_a_data_record_resumes_with_a_warning(tmp_path, caplog):
    """A checkpoint written before the record was kept: the data cannot be checked, and the
    log says so."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    train(
        compose(overrides=tiny_overrides(out, "trainer.max_steps=2", "validate_before_fit=false"))
    )
    last = out / "checkpoints" / "last.ckpt"
    old = torch.load(last, weights_only=True)
    del old[DATA_RECORD]
    torch.save(old, last)
    with caplog.at_level("WARNING", logger="bert_lightning.training.resume"):
        train(compose(overrides=tiny_overrides(out, f"ckpt_path={last}", "trainer.max_steps=3")))
    assert (
        caplog.messages.count(
            f"{last} records no data (written before checkpoints did): this run's data are not "
            "checked against those it trained on"
        )
        == 1
    )


def distill(out, teacher, *extra):
    """A 2-step distillation of `teacher` into a tiny student (soft_mlm among its losses),
    writing into `out` (its corpus.jsonl written); its last.ckpt."""
    overrides = tiny_overrides(
        out, "objective=distill", f"objective.teacher={teacher}", "objective.soft_mlm=1.0",
        "trainer.max_steps=2", "validate_before_fit=false", *extra,
    )  # fmt: skip
    train(compose(overrides=overrides))
    return out / "checkpoints" / "last.ckpt"


def test_a_distillation_resumes_with_its_objective_only(tmp_path):
    """A resume keeps every objective setting (a loss weight left out, another temperature)
    and its teacher's contents (the teacher overwritten at its path): each refused in one line
    naming what differs, before anything is written."""
    teacher = tmp_path / "teacher" / "checkpoints" / "last.ckpt"
    pretrain_tiny(tmp_path / "teacher", "trainer.max_steps=2", "validate_before_fit=false")
    out = tmp_path / "student"
    write_corpus(out / "corpus.jsonl")
    last = distill(out, teacher)
    again = ("trainer.max_steps=4", f"ckpt_path={last}")
    written = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    refused = f"{last}: trained with other objective settings: "
    keeps = "; a resumed run keeps its objective (give the run's settings)"
    with pytest.raises(UserError) as e:
        distill(out, teacher, *again, "objective.soft_mlm=0", "objective.temperature=4")
    assert (
        str(e.value) == f"{refused}objective.soft_mlm 1 -> 0, objective.temperature 2 -> 4{keeps}"
    )
    raw = torch.load(teacher, weights_only=True)
    raw["state_dict"] = {k: v + 1 for k, v in raw["state_dict"].items()}  # retrained, same path
    torch.save(raw, teacher)
    with pytest.raises(UserError) as e:
        distill(out, teacher, *again)
    assert str(e.value) == f"{refused}objective.teacher: last.ckpt changed (its contents){keeps}"
    assert {p: p.stat().st_mtime_ns for p in written} == written


def lrs(out, steps) -> list[float]:
    """The learning rate of each of `steps` (metrics.csv's `lr/model`)."""
    with open(out / "metrics.csv", newline="") as f:
        rows = {int(r["step"]): float(r["lr/model"]) for r in csv.DictReader(f) if r["lr/model"]}
    return [rows[s] for s in steps]


def test_a_resume_keeps_the_runs_schedule_unless_the_command_line_changes_it(tmp_path, capsys):
    """`optim.*` of the first run (lr, warmup) are the checkpoint's: a resume that leaves them
    out trains at the uninterrupted run's rates, not at conf/optim's; `optim.lr=` given on the
    command line is used, and the log names it."""
    first = ("optim.lr=1e-2", "optim.warmup_steps=2", *RESUMABLE)

    def run(name, *extra):
        pretrain_tiny(tmp_path / name, *extra)
        return tmp_path / name / "checkpoints" / "last.ckpt"

    run("whole", *first)
    crash = ("+callbacks.crash._target_=probe.CrashAt", "+callbacks.crash.step=4")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run("killed", *first, *crash)
    killed = tmp_path / "killed" / "checkpoints" / "last.ckpt"
    run("resumed", *RESUMABLE, f"ckpt_path={killed}")  # in process: the checkpoint's optim
    steps = range(5, 9)
    assert lrs(tmp_path / "resumed", steps) == lrs(tmp_path / "whole", steps)

    out = tmp_path / "given"
    shutil.copytree(tmp_path / "killed", out)
    again = [*RESUMABLE, f"ckpt_path={out / 'checkpoints' / 'last.ckpt'}", "optim.lr=5e-3"]
    main(["pretrain", *tiny_overrides(out, f"hydra.run.dir={tmp_path / 'h'}", *again)])
    assert lrs(out, steps) == pytest.approx([lr / 2 for lr in lrs(tmp_path / "whole", steps)])
    log = (tmp_path / "h" / "pretrain.log").read_text()
    assert "optim.lr=0.005 replaces the 0.01 of the run it continues" in log


def pretrained_regression(tmp_path, *extra):
    """finetune_regression from a tiny pretrained checkpoint (tmp_path/pre.ckpt): results.json;
    its last.ckpt, at step 4."""
    write_our_ckpt(tmp_path / "pre.ckpt", write_tokenizer(tmp_path / "tokenizer.json"))
    write_jsonl(tmp_path / "train.jsonl", regression_rows(48))
    return finetune_regression(tmp_path, f"init_from={tmp_path / 'pre.ckpt'}", *extra)


def test_a_resumed_fine_tuning_names_what_it_started_from(tmp_path):
    """results.json of a resumed run names the pretrained weights of its first part, not
    null."""
    first = pretrained_regression(tmp_path)
    assert first["init_from"] == f"checkpoint {tmp_path / 'pre.ckpt'}"
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    again = f"init_from={tmp_path / 'pre.ckpt'}"  # the start it records, moved since: accepted
    (tmp_path / "pre.ckpt").rename(tmp_path / "moved.ckpt")
    resumed = finetune_regression(tmp_path, f"ckpt_path={last}", "trainer.max_steps=6", again)
    assert resumed["steps"] == 6 and resumed["init_from"] == first["init_from"]
    (tmp_path / "moved.ckpt").rename(tmp_path / "pre.ckpt")
    with pytest.raises(UserError) as e:  # another start would be ignored: refused
        finetune_regression(
            tmp_path, f"ckpt_path={last}", "trainer.max_steps=8", f"init_from={last}"
        )
    assert str(e.value) == (
        f"init_from={last}: {last} started from {tmp_path / 'pre.ckpt'}; a resumed run goes on "
        "from its checkpoint (leave init_from out, or give the start it records)"
    )
    raw = torch.load(last, weights_only=True)  # a checkpoint that records no start
    del raw["hyper_parameters"]["start"]
    torch.save(raw, tmp_path / "bare.ckpt")
    with pytest.raises(UserError) as e:
        bare = tmp_path / "bare.ckpt"
        finetune_regression(tmp_path, f"ckpt_path={bare}", "trainer.max_steps=8", again)
    assert str(e.value) == (
        f"{again}: {bare} records no start (random weights, or fine-tuned before checkpoints "
        "kept one) to check it against; a resumed run goes on from its checkpoint: leave "
        "init_from out"
    )


def test_a_frozen_encoder_resumed_without_freeze_encoder_is_refused(tmp_path):
    """freeze_encoder makes the optimizer's groups: a resume without it is one line, not the
    optimizer's ValueError."""
    pretrained_regression(tmp_path, "freeze_encoder=true")
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    with pytest.raises(UserError) as e:
        finetune_regression(tmp_path, f"ckpt_path={last}", "trainer.max_steps=6")
    assert str(e.value) == (
        f"{last}: trained with freeze_encoder=True, this run has freeze_encoder=False; a resumed "
        "run keeps its frozen encoder (give freeze_encoder=True)"
    )


def test_a_student_tokenizer_that_normalizes_otherwise_is_refused(tmp_path):
    """A student from a copy of its teacher's folder that keeps case (`do_lower_case: false`)
    has the teacher's vocabulary but not its ids ("The Cat": [UNK] [UNK]): refused, naming
    what differs."""
    teacher, student = tmp_path / "teacher", tmp_path / "student"
    write_hf_folder(teacher, write_tokenizer(tmp_path / "tokenizer.json"))
    shutil.copytree(teacher, student)
    (student / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    write_corpus(tmp_path / "corpus.jsonl")
    with pytest.raises(UserError) as e:
        distill(tmp_path, teacher, f"init_from={student}", "objective.soft_mlm=0")  # no head
    assert str(e.value) == (
        f"init_from={student} and objective.teacher={teacher} have different normalizers; "
        "expected one tokenizer"
    )


@pytest.mark.parametrize(
    "given", ["data.tokenizer.vocab_size=5000", "data.tokenizer.min_frequency=5"]
)
def test_a_tokenizer_setting_that_init_from_overrides_is_refused(tmp_path, capsys, given):
    """`init_from=` gives the tokenizer: a vocabulary size or frequency for the one a run would
    train is not silently dropped but refused in one line, before a tokenizer is written."""
    pre = tmp_path / "pre.ckpt"
    write_our_ckpt(pre, write_tokenizer(tmp_path / "tokenizer.json"))
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    argv = tiny_overrides(out, f"hydra.run.dir={tmp_path / 'h'}", f"init_from={pre}", given)
    with pytest.raises(SystemExit) as e:
        main(["pretrain", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert err.rstrip().splitlines()[-1] == (
        f"error: {given}: the run reads the tokenizer of checkpoint {pre} (init_from= or a "
        "teacher gives it; these settings shape a tokenizer trained on the corpus only); leave "
        "them out"
    )
    assert not (out / "tokenizer.json").exists()


def test_a_tokenizer_setting_a_config_gives_beside_init_from_is_said_unused(tmp_path, caplog):
    """The same setting from a config (an experiment's `data.tokenizer.vocab_size`), not the
    command line: the run goes on with init_from='s tokenizer, and a warning says so."""
    from bert_lightning.training.pretrain import build

    pre = tmp_path / "pre.ckpt"
    write_our_ckpt(pre, write_tokenizer(tmp_path / "tokenizer.json"))
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    cfg = compose(overrides=tiny_overrides(out, f"init_from={pre}"))
    cfg.data.tokenizer.vocab_size = 30522  # as experiment=bert_base_c4 sets it
    with caplog.at_level("WARNING", logger="bert_lightning.training.start"):
        build(cfg)
    (line,) = [r.getMessage() for r in caplog.records if "unused" in r.getMessage()]
    assert line == (
        "data.tokenizer.vocab_size=30522 (set by the config, not the command line): unused; "
        f"the run reads the tokenizer of checkpoint {pre} (init_from= or a teacher gives it; "
        "these settings shape a tokenizer trained on the corpus only)"
    )


def test_a_resume_keeps_the_configured_patience_and_the_checkpoints_wait():
    """Lightning's EarlyStopping takes the patience of the checkpoint's run: ours keeps the
    one the resumed run is given, and the count of validations without improvement."""
    before = EarlyStopping(monitor="val/loss", patience=1)
    before.wait_count = 1
    after = EarlyStopping(monitor="val/loss", patience=100)
    after.load_state_dict(before.state_dict())
    assert (after.patience, after.wait_count) == (100, 1)


@pytest.mark.parametrize("new_data", [False, True])
def test_a_resume_validating_by_another_metric_is_refused(new_data):
    """The best checkpoint and early stopping compare validations by one metric: another
    monitor or mode is refused, even with resume_with_new_data=true (whose checkpoint state
    would be dropped, and `last.ckpt` left at the stop's step)."""
    was = {"task": {"monitor": "loss", "mode": "min", "train_file": "a.csv"}}
    now = {"task": {"monitor": "acc", "mode": "max", "train_file": "a.csv"}}
    with pytest.raises(UserError) as e:
        check_same_data(SimpleNamespace(data=was), "last.ckpt", now, new_data)
    assert str(e.value) == (
        "last.ckpt: its run validated by another metric: task.monitor loss -> acc; "
        "task.mode min -> max; the best checkpoint and early stopping compare every validation "
        "of a run by one metric: start a new run from it (init_from=) to select by another"
    )


@pytest.mark.slow
def test_a_pretraining_run_stopped_in_a_later_epoch_resumes_bitwise(tmp_path):
    """Four documents in batches of 16: an epoch is two steps, so the stop at step 5 falls in
    epoch 2. The resumed loader continues that epoch's order and masks (its sampler's epoch is
    set only after it fetched its first batch): the weights at step 8 are the whole run's."""
    small = ("data.val_docs=2", "data.batch_size=16", *RESUMABLE)

    def run(name, *extra):
        out = tmp_path / name
        write_corpus(out / "corpus.jsonl", n_docs=4)
        train(compose(overrides=tiny_overrides(out, *small, *extra)))
        return torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)

    whole = run("whole")
    signal_at = [f"+callbacks.signal._target_={__name__}.SignalAt", "+callbacks.signal.step=4"]
    with pytest.raises(Interrupted):
        run("stopped", *signal_at, "+callbacks.signal.sig=SIGTERM")
    last = tmp_path / "stopped" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["epoch"] == 2
    resumed = run("stopped", f"ckpt_path={last}")
    assert whole["epoch"] == 3 and resumed["global_step"] == whole["global_step"] == 8
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name
