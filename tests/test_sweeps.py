"""Hydra multiruns of train.py: the basic sweeper's grid and the Optuna search, which must
minimise the validation loss that train() returns."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser

from helpers import ROOT, tiny_overrides, write_corpus


def test_grid_of_two_by_two_is_four_jobs():
    overrides = OverridesParser.create().parse_overrides(
        ["optim.lr=1e-4,3e-4", "model=bert_tiny,bert_mini"]
    )
    (jobs,) = BasicSweeper.split_arguments(overrides, max_batch_size=None)
    assert sorted(map(tuple, jobs)) == sorted(
        (f"optim.lr={lr}", f"model={m}")
        for lr in ("0.0001", "0.0003")
        for m in ("bert_tiny", "bert_mini")
    )


def multirun(tmp_path: Path, *extra: str) -> tuple[Path, str]:
    """A sweep with tiny settings; returns its folder (one numbered subfolder per job) and what
    it printed (stdout, then stderr)."""
    write_corpus(tmp_path / "corpus.jsonl")
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("paths.output_dir")]
    overrides += [
        f"paths.log_dir={tmp_path / 'out'}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "validate_before_fit=false",
        *(e for e in extra if not e.startswith("-")),
    ]
    flags = [e for e in extra if e.startswith("-")]  # Hydra's flags go before the overrides
    r = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *flags, *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (sweep,) = (tmp_path / "out" / "pretrain" / "multiruns").iterdir()
    return sweep, r.stdout + r.stderr


def last_val_loss(job: Path) -> float:
    with open(job / "metrics.csv") as f:
        return [float(r["val/loss"]) for r in csv.DictReader(f) if r["val/loss"]][-1]


@pytest.mark.slow
def test_basic_sweep_runs_each_job_in_its_own_folder(tmp_path):
    sweep, _ = multirun(tmp_path, "-m", "optim.lr=1e-3,3e-3")
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name for j in jobs] == ["0", "1"]
    lrs = []
    for job in jobs:
        assert (job / "checkpoints" / "last.ckpt").is_file()
        lrs.append(yaml.safe_load((job / "config_resolved.yaml").read_text())["optim"]["lr"])
    assert lrs == [1e-3, 3e-3]
    with open(sweep / "multirun_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["job"] for r in rows] == ["0", "1"]
    assert [r["status"] for r in rows] == ["COMPLETED", "COMPLETED"]
    for row, lr, job in zip(rows, ("0.001", "0.003"), jobs, strict=True):
        assert row["overrides"] == f"optim.lr={lr}"  # what all jobs share is left out
        assert float(row["val/loss"]) == pytest.approx(last_val_loss(job), abs=1e-5)


@pytest.mark.slow
def test_optuna_search_minimises_validation_loss(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    sweep, printed = multirun(tmp_path, "hparams_search=mlm_optuna", "hydra.sweeper.n_trials=2")
    # Optuna's line as Hydra's: no colour codes for a redirected log
    assert "[HYDRA] A new study created in memory with name: mlm_lr_warmup\n" in printed
    assert "\x1b[" not in printed
    result = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    losses = {job.name: last_val_loss(job) for job in sweep.iterdir() if job.is_dir()}
    assert len(losses) == 2
    assert result["best_value"] == pytest.approx(min(losses.values()), abs=1e-6)
