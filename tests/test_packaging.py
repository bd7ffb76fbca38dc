"""The package works installed from a wheel, away from the checkout: the configs (`conf/` in
the repository) ship inside it as `bert_lightning/conf/`, and `bert-lightning pretrain` runs
what `python train.py` runs."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from bert_lightning.cli import main
from bert_lightning.config import CONFIG_DIR
from helpers import ROOT


def test_the_configs_have_one_home_at_the_top_of_the_checkout():
    """conf/ is the one Hydra tree (an editable install reads it in place), no copy in the
    package, whose only YAML files are the downstream suite's budgets (not a config group)."""
    assert CONFIG_DIR == ROOT / "conf" and (CONFIG_DIR / "train.yaml").is_file()
    package = ROOT / "bert_lightning"
    budgets = package / "experiments" / "budgets"
    found = sorted(package.rglob("*.yaml"))
    assert found == sorted(budgets.glob("*.yaml")) and budgets / "cpu.yaml" in found


def test_pretrain_and_finetune_subcommands_hand_their_overrides_to_hydra(
    tmp_path, monkeypatch, capsys
):
    """`--cfg job` prints the config that would run: the overrides after the subcommand and
    the packaged configs composed as train.py / finetune.py compose them."""
    monkeypatch.chdir(tmp_path)
    main(["pretrain", "model=bert_mini", "--cfg", "job"])
    assert "hidden_size: 256" in capsys.readouterr().out
    main(["finetune", "experiment=brackets_grammar", "--cfg", "job"])
    assert "max_seq_length: 18" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())  # nothing written: no run, no resolver side effect


@pytest.mark.slow
def test_a_wheel_installed_elsewhere_pretrains(tmp_path):
    # the wheel, built from a copy (no build/ or egg-info left in the checkout)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "pyproject.toml", src)
    shutil.copy(ROOT / "README.md", src)
    shutil.copytree(ROOT / "bert_lightning", src / "bert_lightning")
    shutil.copytree(ROOT / "conf", src / "conf")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(src), "-w",
                    str(tmp_path / "dist")], check=True)  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("bert_lightning-*.whl")
    # every module and every config, the configs under the package (pyproject's package-dir)
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "bert_lightning/conf/train.yaml" in names
    assert not [n for n in names if n.startswith("conf/")]  # not a top-level `conf` too
    for tree, into in [
        (ROOT / "bert_lightning", "bert_lightning"),
        (CONFIG_DIR, "bert_lightning/conf"),
    ]:
        files = [p for p in tree.rglob("*") if p.suffix in (".py", ".yaml")]
        missing = {f"{into}/{p.relative_to(tree).as_posix()}" for p in files} - names
        assert not missing, sorted(missing)

    # a fresh venv; the wheel into it, not editable and without dependencies
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], check=True)
    # then the dependencies (torch, lightning, ...) from this environment's site-packages, as
    # a plain path: its .pth files (the editable install's finder among them) are not run
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    work = tmp_path / "work"  # outside the checkout
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    where = subprocess.run(
        [py, "-I", "-c", "import bert_lightning; print(bert_lightning.__file__)"],
        cwd=work, env=env, check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert Path(where).is_relative_to(venv), where

    overrides = [
        "trainer.max_steps=5",
        "trainer.val_check_interval=5",
        "trainer.accelerator=cpu",
        "trainer.enable_progress_bar=false",
        "validate_before_fit=false",
        "model.hidden_size=32",
        "model.num_hidden_layers=1",
        "model.num_attention_heads=2",
        "model.intermediate_size=64",
        "data.max_seq_length=32",
        "data.batch_size=4",
        "data.val_docs=5",
        "data.tokenizer.vocab_size=300",
        "data.tokenizer.max_docs=50",
        f"data.cache_dir={work / 'cache'}",
    ]
    subprocess.run(
        [venv / "bin" / "bert-lightning", "pretrain", *overrides], cwd=work, env=env, check=True
    )
    assert list(work.glob("outputs/pretrain/runs/*/checkpoints/last.ckpt"))
