"""train.py and finetune.py call the Hydra entry of `bert-lightning pretrain|finetune` (one
definition each, in `commands/`), and Hydra names each job, and its log, as before: after the
script (`train.log`) or the subcommand's module (`pretrain.log`)."""

import runpy

import pytest

from bert_lightning.cli import main
from helpers import ROOT


def job_name(printed: str) -> str:
    """`hydra.job.name` in what `--cfg hydra` prints."""
    lines = printed.splitlines()
    at = lines.index("  job:")
    assert lines[at + 1].startswith("    name: "), lines[at : at + 2]
    return lines[at + 1].removeprefix("    name: ")


@pytest.mark.parametrize(
    ("entry", "job"),
    [
        ("train.py", "train"),
        ("finetune.py", "finetune"),
        ("bert-lightning pretrain", "pretrain"),
        ("bert-lightning finetune", "finetune"),
    ],
)
def test_each_entry_names_its_job(entry, job, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", [entry, "--cfg", "hydra"])
    if entry.endswith(".py"):
        runpy.run_path(str(ROOT / entry), run_name="__main__")
    else:
        main([entry.split()[1], "--cfg", "hydra"])
    assert job_name(capsys.readouterr().out) == job
    assert not list(tmp_path.iterdir())  # nothing ran
