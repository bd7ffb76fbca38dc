"""train.py and finetune.py call the Hydra entry of `bert-lightning pretrain|finetune` (one
definition each, in `commands/`), and Hydra names each job, and its log, as before: after the
script (`train.log`) or the subcommand's module (`pretrain.log`)."""

import runpy
import subprocess
import sys

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


HEAVY = ("torch", "lightning", "hydra", "transformers")


def test_every_help_builds_without_torch_lightning_hydra_or_transformers():
    """`bert-lightning --help` and each argparse command's `--help` (in a fresh interpreter)
    import none of the heavy packages: they answer at once. `pretrain`/`finetune --help` are
    Hydra's own help: Hydra, but no torch."""
    probe = f"""
import contextlib, io, sys
from bert_lightning import cli
last = sorted(cli.COMMANDS, key=lambda c: c in cli.HYDRA_COMMANDS)  # Hydra stays imported
for argv in [["--help"]] + [[c.replace("_", "-"), "--help"] for c in last]:
    hydra = argv[0] in cli.HYDRA_COMMANDS
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cli.main(argv)
    except SystemExit as e:
        assert e.code == 0, (argv, e.code)
    loaded = [m for m in {HEAVY!r} if m in sys.modules and not (hydra and m == "hydra")]
    print(" ".join(argv), loaded)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 15 and all(line.endswith(" []") for line in lines), lines
