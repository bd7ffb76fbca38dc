"""A user's mistake is one line `error: ...` on stderr and exit code 2, from every entry point,
with the traceback only on request (HYDRA_FULL_ERROR=1, `--debug`)."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bert_lightning.cli import main
from bert_lightning.data.corpus import BadRecordError
from bert_lightning.errors import UserError, user_error
from finetune_fixtures import (
    ad_rows,
    relevance_ckpt,
    sentiment_rows,
    write_csv,
    write_jsonl,
    write_our_ckpt,
    write_tokenizer,
)
from helpers import ROOT, cli_error, tiny_overrides, write_corpus


def pretrain_error(capsys, tmp_path, *extra) -> str:
    write_corpus(tmp_path / "corpus.jsonl", 20)
    hydra_dir = f"hydra.run.dir={tmp_path / 'hydra'}"
    return cli_error(capsys, "pretrain", *tiny_overrides(tmp_path, hydra_dir, *extra))


@pytest.mark.slow
def test_a_bad_json_line_names_file_line_and_column_from_train_py(tmp_path):
    out = tmp_path / "run"
    corpus = write_corpus(out / "corpus.jsonl", 20)
    lines = corpus.read_text().splitlines()
    lines[2] = '{"text": "a\tb"}'  # a raw tab inside a JSON string, column 12
    corpus.write_text("\n".join(lines) + "\n")
    r = subprocess.run(
        [sys.executable, "train.py", *tiny_overrides(out, f"hydra.run.dir={tmp_path / 'h'}")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "HYDRA_FULL_ERROR": "0"},
    )
    assert r.returncode == 2
    assert r.stderr == (  # that line alone: Lightning's lines (seeding) go to the log's stdout
        f"error: {corpus}:3:12: invalid JSON (Invalid control character at column 12); "
        "data.on_bad_record=skip skips such records\n"
    )


def test_a_missing_file_raised_inside_hydra_instantiate_is_one_line(tmp_path, capsys):
    nope = tmp_path / "nope.jsonl"
    err = pretrain_error(capsys, tmp_path, f"data.train_files={nope}")
    assert err == f"error: {nope}: no such file or folder"


def test_a_missing_task_file_is_one_line(tmp_path, capsys):
    run = [f"hydra.run.dir={tmp_path / 'h'}", f"paths.output_dir={tmp_path / 'run'}"]
    err = cli_error(capsys, "finetune", f"task.train_file={tmp_path / 'x.csv'}", *run)
    assert err == f"error: {tmp_path / 'x.csv'}: no such data file"


def test_a_folder_as_task_file_is_one_line(tmp_path, capsys):
    run = [f"hydra.run.dir={tmp_path / 'h'}", f"paths.output_dir={tmp_path / 'run'}"]
    err = cli_error(capsys, "finetune", f"task.train_file={tmp_path}", *run)
    assert err == f"error: {tmp_path}: a folder; expected a data file"


def test_a_misspelt_key_is_one_line(tmp_path, capsys):
    err = pretrain_error(capsys, tmp_path, "+data.masking.mlm_probabilty=0.2")
    assert err == (
        "error: data.masking: unknown key(s) ['mlm_probabilty']; "
        "known keys: ['mlm_probability', 'p_mask', 'p_random', 'whole_word']"
    )


def test_a_bad_config_value_is_one_line(tmp_path, capsys):
    err = pretrain_error(capsys, tmp_path, "data.packing=pakced")
    expected = "('packed', 'packed_isolated', 'document')"
    assert err == f"error: data.packing='pakced'; expected one of {expected}"


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.batch_size=abc", "data.batch_size: expected int, got 'abc'"),
        ("trainer.max_steps=ten", "trainer.max_steps: expected int, got 'ten'"),
        ("model.hidden_size=1.5", "model.hidden_size: expected int, got 1.5"),
        ("optim.lr=fast", "optim.lr: expected float, got 'fast'"),
        ("data.masking.mlm_probability=x", "data.masking.mlm_probability: expected float, got 'x'"),
        ("data.tokenizer.vocab_size=1e3", "data.tokenizer.vocab_size: expected int, got 1000.0"),
    ],
)
def test_a_value_of_the_wrong_type_names_its_key(tmp_path, capsys, override, message):
    assert pretrain_error(capsys, tmp_path, override) == f"error: {message}"
    assert not (tmp_path / "checkpoints").exists()


def test_a_bad_line_of_a_task_jsonl_names_line_and_column(tmp_path, capsys):
    train = write_jsonl(tmp_path / "train.jsonl", sentiment_rows(20))
    train.write_text(train.read_text() + '{"sentence": oops, "label": 1}\n')
    run = [f"hydra.run.dir={tmp_path / 'h'}", f"paths.output_dir={tmp_path / 'run'}"]
    err = cli_error(capsys, "finetune", f"task.train_file={train}", *run)
    assert err == f"error: {train}:21:14: invalid JSON (Expecting value)"
    train.write_text(train.read_text().replace("oops", '"ok"') + "[1, 2]\n")
    err = cli_error(capsys, "finetune", f"task.train_file={train}", *run)
    assert err == f"error: {train}:22: a JSON list; expected an object"


def test_resuming_with_another_model_names_the_settings(tmp_path, capsys):
    ckpt = tmp_path / "pre.ckpt"
    write_our_ckpt(ckpt, write_tokenizer(tmp_path / "tokenizer.json"))  # 2 layers, width 32
    # dropout may change on a resume: it shapes no weight
    same = "model.max_position_embeddings=64"  # as the checkpoint's
    changed = ["model.num_hidden_layers=3", "model.hidden_act=relu", "model.hidden_dropout_prob=0"]
    err = pretrain_error(capsys, tmp_path, f"ckpt_path={ckpt}", same, *changed)
    assert err == (
        f"error: {ckpt}: its model has model.num_hidden_layers=2, model.hidden_act=gelu, "
        "this run's has 3, relu; a resumed run keeps its model (give the run's settings)"
    )
    err = pretrain_error(capsys, tmp_path, f"ckpt_path={ckpt}", same, "optim.head_lr=0.1")
    assert err == (
        "error: optim.head_lr=0.1, but the run it continues had None: a resumed run keeps its "
        "optimizer's parameter groups (a rate may change, not whether the heads have rates of "
        "their own)"
    )
    err = pretrain_error(capsys, tmp_path, f"ckpt_path={ckpt}", same, "optim.layer_decay=0.8")
    assert err == (
        "error: optim.layer_decay=0.8, but the run it continues had 1.0: a resumed run keeps "
        "its optimizer's parameter groups (a rate may change, not whether the layers have "
        "rates of their own)"
    )
    tuned, _ = relevance_ckpt(tmp_path, write_tokenizer(tmp_path / "tokenizer.json"))
    ads = write_csv(tmp_path / "ads.csv", ad_rows())
    run = [f"hydra.run.dir={tmp_path / 'h'}", f"paths.output_dir={tmp_path / 'run'}"]
    task = ["task=ad_relevance", f"task.train_file={ads}", "task.label_type=graded"]
    bi = ["task.architecture=bi_encoder", "task.pooling=mean", "data.max_seq_length=32"]
    err = cli_error(capsys, "finetune", *task, *bi, f"ckpt_path={tuned}", *run)
    assert err == (
        f"error: {tuned}: its model has task.architecture=cross_encoder, task.pooling=cls, "
        "this run's has bi_encoder, mean; a resumed run keeps its model (give the run's settings)"
    )


def test_a_text_file_named_ckpt_is_not_a_checkpoint(tmp_path, capsys):
    fake = tmp_path / "model.ckpt"
    fake.write_text("hello\n")
    err = cli_error(capsys, "fill-mask", fake, "a [MASK] b")
    assert err == (
        f"error: {fake}: not a checkpoint "
        "(torch.load could not read it: not the zip archive torch.save writes)"
    )


@pytest.fixture
def mismatched(tmp_path):
    """A pretraining .ckpt whose tokenizer has more tokens than its model has embeddings."""
    small = write_tokenizer(tmp_path / "small.json")
    path = tmp_path / "mismatch.ckpt"
    write_our_ckpt(path, small)
    raw = torch.load(path, weights_only=True)
    big = small.__class__.from_str(small.to_str())
    big.add_tokens([f"extra{i}" for i in range(10)])
    raw["tokenizer"] = big.to_str()
    torch.save(raw, path)
    want = f"the model has a vocabulary of {small.get_vocab_size()} but its tokenizer has "
    return path, f"error: {path}: {want}{big.get_vocab_size()} tokens"


def test_vocabulary_mismatch_in_fill_mask(mismatched, capsys):
    path, message = mismatched
    assert cli_error(capsys, "fill-mask", path, "a [MASK] b") == message


def test_vocabulary_mismatch_as_pretrained(tmp_path, mismatched, capsys):
    path, message = mismatched
    train = write_csv(tmp_path / "train.csv", sentiment_rows(20))
    run = [f"hydra.run.dir={tmp_path / 'h'}", f"paths.output_dir={tmp_path / 'run'}"]
    err = cli_error(capsys, "finetune", f"task.train_file={train}", f"init_from={path}", *run)
    assert err == message


def test_a_fine_tuning_checkpoint_as_pretraining_ckpt_path(tmp_path, capsys):
    ckpt, _ = relevance_ckpt(tmp_path, write_tokenizer(tmp_path / "tokenizer.json"))
    err = pretrain_error(capsys, tmp_path, f"ckpt_path={ckpt}")
    assert err == (
        f"error: {ckpt}: a fine-tuning checkpoint; "
        "ckpt_path (resuming a pretraining run) needs a pretraining one"
    )


def test_debug_and_hydra_full_error_keep_the_traceback(tmp_path, monkeypatch):
    fake = tmp_path / "model.ckpt"
    fake.write_text("hello\n")
    with pytest.raises(UserError, match="not a checkpoint"):
        main(["--debug", "fill-mask", str(fake), "a [MASK] b"])
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    write_corpus(tmp_path / "corpus.jsonl", 20)
    overrides = tiny_overrides(tmp_path, f"hydra.run.dir={tmp_path / 'h'}", "data.packing=x")
    with pytest.raises(UserError, match=r"^data\.packing='x'; expected one of"):
        main(["pretrain", *overrides])


def test_other_exceptions_stay_tracebacks():
    from bert_lightning.errors import reported

    with pytest.raises(KeyError), reported():
        raise KeyError("a bug")
    wrapped = RuntimeError("wrapper")
    wrapped.__cause__ = BadRecordError("f.jsonl:3: no 'text' field")
    assert str(user_error(wrapped)) == "f.jsonl:3: no 'text' field"


@pytest.mark.parametrize(
    ("argv", "key"),
    [
        (["pretrain", "data=text"], "data.train_files"),
        (["pretrain", "data=c4_local", "data.train_files=x.json.gz"], "data.val_files"),
        (["finetune", "dataset=sst2"], "data_dir"),
        (["finetune", "task=ad_relevance"], "task.train_file"),
    ],
)
def test_a_required_value_left_out_is_named_and_leaves_no_folder(tmp_path, capsys, argv, key):
    """`???` stays required through the data options' merge (data=text once trained on the
    bundled sample); the folder Hydra made for the refused run is removed."""
    logs = tmp_path / "logs"
    err = cli_error(capsys, *argv, f"paths.log_dir={logs}")
    assert err == f"error: {key}: required and not given; add {key}=... to the command"
    assert not logs.exists()  # nor the empty <task>/runs/ folders above the run's


def snapshot(folder: Path) -> dict:
    return {
        str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.suffix != ".log"  # Hydra's job log records the attempt
    }


def test_a_refused_resume_leaves_the_run_it_names_as_it_was(tmp_path, capsys):
    """A fine-tuning run's checkpoint given to pretraining: no FAILED, no log in that run, and
    no folder of its own left; a pretraining run resumed with another model: its folder
    (tokenizer.json included) untouched."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    tuned = tmp_path / "tuned"
    (tuned / "checkpoints").mkdir(parents=True)
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    ckpt = ckpt.rename(tuned / "checkpoints" / "last.ckpt")
    (tuned / "config_resolved.yaml").write_text("task:\n  kind: ad_relevance\n")
    before = snapshot(tuned)
    logs = tmp_path / "logs"
    err = cli_error(capsys, "pretrain", f"ckpt_path={ckpt}", f"paths.log_dir={logs}")
    assert err.startswith(f"error: {ckpt}: a fine-tuning checkpoint; ")
    assert snapshot(tuned) == before and sorted(p.name for p in tuned.iterdir()) == [
        "checkpoints",
        "config_resolved.yaml",
    ]
    assert not any(p.is_dir() for p in logs.glob("*/runs/*"))

    run = tmp_path / "run"
    write_corpus(run / "corpus.jsonl", 20)
    from bert_lightning.config import compose
    from bert_lightning.training.pretrain import train

    train(compose(overrides=tiny_overrides(run, "trainer.max_steps=2")))
    last = run / "checkpoints" / "last.ckpt"
    before = snapshot(run)
    overrides = [o for o in tiny_overrides(run) if not o.startswith("paths.output_dir")]
    err = cli_error(
        capsys, "pretrain", *overrides, f"ckpt_path={last}", "model.num_hidden_layers=3"
    )
    assert err.startswith(f"error: {last}: its model has model.num_hidden_layers=2")
    assert snapshot(run) == before and not (run / "FAILED").exists()


@pytest.mark.parametrize(
    ("override", "said"),
    [("trainer.precision=fp16", "'fp16'"), ("trainer=deepspeed", "")],
)
def test_lightning_refusing_a_trainer_setting_is_one_line(tmp_path, capsys, override, said):
    """A precision Lightning does not know, a strategy this machine cannot run."""
    err = pretrain_error(capsys, tmp_path, override)
    assert err.startswith("error: trainer: ") and said in err


def test_the_bert_base_recipe_without_its_shards_is_refused(tmp_path, capsys):
    logs = tmp_path / "logs"
    err = cli_error(capsys, "pretrain", "experiment=bert_base_c4", f"paths.log_dir={logs}")
    assert err == (
        "error: data.train_files, data.val_files: required and not given; "
        "add data.train_files=... data.val_files=... to the command"
    )


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_file_that_cannot_be_written_is_named_not_its_temporary(tmp_path, monkeypatch, code):
    """A full disk or a folder without write permission: one line naming the target; the
    temporary sibling is gone and what was there stays."""
    from bert_lightning import atomic

    target = tmp_path / "results.json"
    target.write_text("old\n")

    def refuse(src, dst):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(UserError) as e:
        atomic.write_json({"a": 1}, target)
    assert str(e.value) == f"{target}: cannot write it ({os.strerror(code)})"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]
    assert target.read_text() == "old\n"


def test_rtd_mistakes_are_one_line(tmp_path, capsys):
    """An RTD checkpoint asked to fill masks; a resume that changes the objective; RTD on NSP
    pairs."""
    write_corpus(tmp_path / "corpus.jsonl", 20)
    run = tmp_path / "rtd"
    overrides = tiny_overrides(
        tmp_path, f"hydra.run.dir={tmp_path / 'h'}", f"paths.output_dir={run}", "objective=rtd"
    )
    main(["pretrain", *overrides, "trainer.max_steps=2", "validate_before_fit=false"])
    ckpt = run / "checkpoints" / "last.ckpt"
    assert cli_error(capsys, "fill-mask", ckpt, "a [MASK] b") == (
        f"error: {ckpt}: an RTD (objective=rtd) checkpoint; its generator is a small helper of "
        "pretraining, not a masked language model, so fill-mask does not serve it (fine-tune, "
        "embed or export-hf its encoder)"
    )
    err = pretrain_error(capsys, tmp_path, f"ckpt_path={ckpt}", "trainer.max_steps=4")
    assert err == (
        f"error: {ckpt}: trained with objective=rtd with generator_hidden_size=0.25, this run "
        "asks for objective=mlm; a resumed run keeps its objective"
    )
    err = pretrain_error(capsys, tmp_path, "objective=rtd", "data=c4_nsp")
    assert err == (
        "error: objective=rtd trains on masked text; this data option makes NSP examples "
        "(data=c4_nsp: data.nsp=false gives its pairs without NSP)"
    )
