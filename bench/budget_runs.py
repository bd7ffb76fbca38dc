"""What the budgeted pretraining benchmarks share (budget_curve, ablate): one run of ours, of
RTD or of `transformers` under a wall-clock budget, continued where a stopped one left off,
and the steps it took. A run's folder is reused only for the trainer, budget and overrides it
was started with (`<folder>.key`); other ones start it again."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bert_lightning.atomic import write_text
from bert_lightning.config import dd_hh_mm_ss
from bert_lightning.fingerprints import fingerprint

ROOT = Path(__file__).resolve().parents[1]


# what pretrains each curve: train.py with these overrides, or bench/hf_pretrain.py (None)
TRAINERS = {"ours": [], "rtd": ["objective=rtd"], "transformers": None}


def max_time(minutes: float) -> str:
    """Minutes as `trainer.max_time`'s DD:HH:MM:SS (whole seconds)."""
    return dd_hh_mm_ss(round(minutes * 60))


def pretrain(trainer: str, folder: Path, minutes: float, overrides: list[str]) -> Path:
    """One budgeted run, skipped when finished; the model the suite reads. A run of ours that
    was stopped (its `last.ckpt` there, no `<folder>.done` beside it) continues from its
    checkpoint and spends what is left of its budget: a long budget can be run in pieces."""
    budget = [*overrides, "trainer.max_steps=-1", f"trainer.max_time={max_time(minutes)}"]
    done = folder.parent / f"{folder.name}.done"
    key, kept = fingerprint(trainer, minutes, overrides), folder.parent / f"{folder.name}.key"
    if (folder.exists() or done.exists()) and (not kept.is_file() or kept.read_text() != key):
        print(f"{folder.name}: started with other settings: pretraining again", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        done.unlink(missing_ok=True)
    write_text(kept, key)
    if TRAINERS[trainer] is not None:
        model = folder / "checkpoints" / "last.ckpt"
        cmd = [str(ROOT / "train.py"), *budget, *TRAINERS[trainer], f"paths.output_dir={folder}"]
        finished = done.exists()
        if not finished and model.exists():
            cmd.append(f"ckpt_path={model}")
            print(f"continuing {folder.name} from {model}", flush=True)
    else:
        model = folder / "hf_model"
        cmd = [str(ROOT / "bench" / "hf_pretrain.py"), str(folder), *budget]
        finished = model.exists()
    if not finished:
        print(f"pretraining {folder.name} ({minutes:g} min)", flush=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "bench")]))
        with open(folder.parent / f"{folder.name}.log", "a") as log:
            subprocess.run([sys.executable, *cmd], env=env, stdout=log, stderr=log, check=True)
        done.touch()
    return model


def steps_taken(trainer: str, folder: Path) -> int:
    """The optimizer steps a run took in its budget (its metrics.csv, its summary.json)."""
    if trainer == "transformers":
        return json.loads((folder / "summary.json").read_text())["steps"]
    with open(folder / "metrics.csv", newline="") as f:  # `step`: optimizer steps done
        return max(int(r["step"]) for r in csv.DictReader(f) if r.get("step"))
