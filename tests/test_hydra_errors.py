"""A mistake on the command line that Hydra finds while composing the config, before the run
starts (a misspelt key, a config group option that does not exist), is one line `error: ...`
and exit code 2 from train.py, finetune.py and `bert-lightning pretrain|finetune` alike; the
traceback only on request (HYDRA_FULL_ERROR=1)."""

import runpy

import pytest
from hydra.errors import MissingConfigException

from bert_lightning.cli import main
from bert_lightning.config import CONFIG_DIR
from bert_lightning.errors import UserError
from helpers import ROOT

MODELS = ", ".join(sorted(p.stem for p in (CONFIG_DIR / "model").glob("[!_]*.yaml")))
MISTAKES = [
    (
        "trainer.max_stepz=3",
        "error: trainer.max_stepz: no such key; did you mean trainer.max_steps or "
        "trainer.max_time or trainer.max_epochs? "
        "(add it with +trainer.max_stepz=... if you mean a new one)",
    ),
    ("model=bert_huge", f"error: model=bert_huge: no such option; expected one of {MODELS}"),
    (
        "trainer.max_steps=[",
        "error: trainer.max_steps=[: not an override Hydra can parse (no viable alternative at "
        "input '['); expected key=value, see https://hydra.cc/docs/advanced/override_grammar/basic/",
    ),
]
ENTRY_POINTS = {  # in process: a script reads its overrides from sys.argv
    "train.py": lambda overrides: runpy.run_path(str(ROOT / "train.py"), run_name="__main__"),
    "finetune.py": lambda overrides: runpy.run_path(str(ROOT / "finetune.py"), run_name="__main__"),
    "bert-lightning pretrain": lambda overrides: main(["pretrain", *overrides]),
    "bert-lightning finetune": lambda overrides: main(["finetune", *overrides]),
}


def run(entry: str, monkeypatch, *overrides: str) -> int:
    """The exit code of ENTRY with OVERRIDES."""
    monkeypatch.setattr("sys.argv", [entry, *overrides])
    with pytest.raises(SystemExit) as e:
        ENTRY_POINTS[entry](list(overrides))
    return e.value.code


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("override", "message"), MISTAKES)
def test_a_command_line_mistake_is_one_line(
    entry, override, message, tmp_path, monkeypatch, capsys
):
    assert run(entry, monkeypatch, override, f"paths.output_dir={tmp_path}") == 2
    assert capsys.readouterr().err == message + "\n"
    assert not list(tmp_path.iterdir())  # nothing ran


def test_an_option_of_a_group_of_hydra_own(monkeypatch, capsys):
    assert run("train.py", monkeypatch, "hydra/job_logging=colour") == 2
    assert capsys.readouterr().err == (
        "error: hydra/job_logging=colour: no such option; "
        "expected one of default, disabled, none, stdout\n"
    )


def test_other_composition_errors_keep_hydra_message(monkeypatch, capsys):
    assert run("train.py", monkeypatch, "+trainer.max_steps=3") == 1
    assert "Could not append to config. An item is already at 'trainer.max_steps'" in (
        capsys.readouterr().err
    )


def test_hydra_full_error_keeps_the_traceback(monkeypatch):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(UserError, match="^model=bert_huge: no such option") as e:
        main(["pretrain", "model=bert_huge"])
    assert isinstance(e.value.__cause__, MissingConfigException)


OTHERS = "its file's first lines give its command"
GROUP = "not a group of this entry point (an experiment of the other one? " + OTHERS + ")"
WRONG_ENTRY = [
    ("train.py", "home_depot_minilm", f"experiment=home_depot_minilm: sets `dataset`, {GROUP}"),
    ("finetune.py", "brackets", f"experiment=brackets: sets `data`, {GROUP}"),
    (
        "train.py",
        "brackets_grammar",
        f"task: a key of finetune.py's configs (an experiment of finetune.py? {OTHERS}: "
        "python finetune.py experiment=...)",
    ),
    (
        "finetune.py",
        "cpu_30min",
        "data.masking: not a key of finetune.py's configs (docs/config-keys.md lists them; an "
        f"experiment of train.py? {OTHERS})",
    ),
]


@pytest.mark.parametrize(("entry", "experiment", "message"), WRONG_ENTRY)
def test_an_experiment_of_the_other_entry_point_is_one_line(
    entry, experiment, message, tmp_path, monkeypatch, capsys
):
    """Whether it fails to compose (a group the entry point lacks) or composes (its keys would
    be half-applied), an experiment given to the wrong entry point stops before any step."""
    overrides = (f"experiment={experiment}", f"paths.output_dir={tmp_path}")
    assert run(entry, monkeypatch, *overrides) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("entry", ["train.py", "finetune.py"])
def test_a_key_no_config_of_the_entry_point_has_is_refused_wherever_it_is_set(
    entry, tmp_path, monkeypatch, capsys
):
    """A name no config of the entry point has (a retired one: `pretrained`, `max_seq_length`
    at the top) set by the user's own experiment composes, and would then be ignored."""
    (tmp_path / "conf/experiment").mkdir(parents=True)
    (tmp_path / "conf/experiment/mine.yaml").write_text(
        "# @package _global_\npretrained: pre.ckpt\nmax_seq_length: 16\n"
    )
    over = ("--config-dir", str(tmp_path / "conf"), "experiment=mine", "debug=tiny")
    over += ("task.train_file=x",) if entry == "finetune.py" else ()
    assert run(entry, monkeypatch, *over, f"paths.output_dir={tmp_path / 'run'}") == 2
    other = "finetune.py" if entry == "train.py" else "train.py"
    want = (
        f"pretrained: not a key of {entry}'s configs (docs/config-keys.md lists them; an "
        f"experiment of {other}? {OTHERS})"
    )
    assert capsys.readouterr().err == f"error: {want}\n"
    assert not (tmp_path / "run/checkpoints").exists()


def test_an_experiment_without_its_global_first_line_is_refused(tmp_path, monkeypatch, capsys):
    """Without `# @package _global_` an experiment's keys land under `experiment`, where no
    run reads them: the run would go on as if it had not been given."""
    (tmp_path / "conf/experiment").mkdir(parents=True)
    (tmp_path / "conf/experiment/mine.yaml").write_text("optim:\n  lr: 0.5\n")
    over = ("--config-dir", str(tmp_path / "conf"), "experiment=mine", "debug=tiny")
    assert run("train.py", monkeypatch, *over, f"paths.output_dir={tmp_path / 'run'}") == 2
    assert capsys.readouterr().err == (
        "error: experiment: set under `experiment`, whose options set keys at the top: a file "
        "of experiment/ whose first line is not `# @package _global_`?\n"
    )
    assert not (tmp_path / "run/checkpoints").exists()
