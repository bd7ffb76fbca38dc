"""train.py and finetune.py call the Hydra entry of `bert-lightning pretrain|finetune` (one
definition each, in `commands/`), and Hydra names each job, and its log, as before: after the
script (`train.log`) or the subcommand's module (`pretrain.log`)."""

import runpy
import subprocess
import sys

import pytest

from bert_lightning.cli import COMMANDS, main
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
SCRIPTS = ("train.py", "finetune.py")


def test_every_help_builds_without_torch_lightning_hydra_or_transformers():
    """`bert-lightning --help` and each argparse command's `--help` (in a fresh interpreter)
    import none of the heavy packages: they answer at once. `pretrain`/`finetune --help` and
    train.py's and finetune.py's are Hydra's help: Hydra, but no torch."""
    probe = f"""
import contextlib, io, runpy, sys
from bert_lightning import cli
last = sorted(cli.COMMANDS, key=lambda c: c in cli.HYDRA_COMMANDS)  # Hydra stays imported
helps = [["--help"]] + [[c.replace("_", "-"), "--help"] for c in last]
for argv in helps + [[script, "--help"] for script in {SCRIPTS!r}]:
    script = argv[0] in {SCRIPTS!r}
    hydra = script or argv[0] in cli.HYDRA_COMMANDS
    sys.argv = argv
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            if script:
                runpy.run_path({str(ROOT)!r} + "/" + argv[0], run_name="__main__")
            else:
                cli.main(argv)
    except SystemExit as e:
        assert e.code == 0, (argv, e.code)
    loaded = [m for m in {HEAVY!r} if m in sys.modules and not (hydra and m == "hydra")]
    print(" ".join(argv), loaded)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 1 + len(COMMANDS) + len(SCRIPTS), lines  # each printed its line
    assert all(line.endswith(" []") for line in lines), lines


@pytest.mark.parametrize(
    ("entry", "argv"),
    [("train.py", ["model=bert_base", "--help"]), ("bert-lightning finetune", ["-h"])],
)
def test_help_is_hydras_own_text_without_hydras_slow_way(entry, argv, monkeypatch, capsys):
    """A Hydra entry's `--help` is answered before Hydra runs (`cli.hydra_help`: the groups read
    off conf/ instead of a config composed per group), with the text Hydra prints: the groups
    and their options, the config the overrides make, how to override."""

    def run() -> None:
        monkeypatch.setattr("sys.argv", [entry, *argv])
        if entry.endswith(".py"):
            runpy.run_path(str(ROOT / entry), run_name="__main__")
        else:
            main([entry.split()[1], *argv])

    run()
    ours = capsys.readouterr().out
    monkeypatch.setattr("bert_lightning.cli.hydra_help", lambda *_: False)
    with pytest.raises(SystemExit, match="0"):
        run()
    assert ours == capsys.readouterr().out
    assert "model: _bert_defaults, bert_base," in ours  # a group and its options
