"""The curve a user reads: the downstream suite's average against the pretraining budget, for
ours with MLM (`train.py`), ours with replaced-token detection (`train.py objective=rtd`) and
`transformers` MLM (`bench/hf_pretrain.py`), given the same minutes.

    python bench/budget_curve.py OUT --data-dir ../shared/data experiment=cpu_30min
    python bench/budget_curve.py OUT --minutes 5,15,30 --trainers ours,rtd --seeds 3 \
        --data-dir DIR [overrides...]

For each budget, one pretraining run per trainer on one config (the overrides, with
`trainer.max_time` set to the budget, so each run's learning rate decays to 0 as its time runs
out): `OUT/ours_<m>min/`, `OUT/rtd_<m>min/`, `OUT/transformers_<m>min/`; then one
`bert-lightning downstream` suite over all of them in `OUT/downstream/` (its random row is the
0-minute point of every curve).
Writes `OUT/curve.md`, `OUT/curve.json` and `OUT/curve.png`. Rerun with the same OUT to
continue: a finished pretraining run and a finished cell are not redone, and a run of ours
that was stopped continues from its `last.ckpt` with what is left of its budget. Run nothing
else on the machine meanwhile: a budget is wall time.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from bert_lightning.atomic import write_json, write_text
from bert_lightning.experiments.downstream import downstream
from bert_lightning.training.callbacks import save_figure

ROOT = Path(__file__).resolve().parents[1]

# what pretrains each curve: train.py with these overrides, or bench/hf_pretrain.py (None)
TRAINERS = {"ours": [], "rtd": ["objective=rtd"], "transformers": None}


def max_time(minutes: float) -> str:
    """Minutes as `trainer.max_time`'s DD:HH:MM:SS (whole seconds)."""
    s = int(round(timedelta(minutes=minutes).total_seconds()))
    return f"00:{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def pretrain(trainer: str, folder: Path, minutes: float, overrides: list[str]) -> Path:
    """One budgeted run, skipped when finished; the model the suite reads. A run of ours that
    was stopped (its `last.ckpt` there, no `<folder>.done` beside it) continues from its
    checkpoint and spends what is left of its budget: a long budget can be run in pieces."""
    budget = [*overrides, "trainer.max_steps=-1", f"trainer.max_time={max_time(minutes)}"]
    done = folder.parent / f"{folder.name}.done"
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


def curve(report: dict, minutes: list[float], out: Path, trainers: list[str]) -> dict:
    """Per trainer: (minutes, steps, average, std) points; random weights are the 0-minute
    point of each."""
    models = report["models"]
    random = (0.0, 0, *models["random"]["average"])
    return {
        t: [random]
        + [
            (m, steps_taken(t, out / f"{t}_{m:g}min"), *models[f"{t}_{m:g}min"]["average"])
            for m in minutes
        ]
        for t in trainers
    }


def table(points: dict) -> str:
    head = ["pretraining minutes"] + [f"{t} {c}" for t in points for c in ("steps", "average")]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for i, (m, *_) in enumerate(next(iter(points.values()))):
        cells = []
        for t in points:
            _, steps, avg, std = points[t][i]
            cells += [f"{steps:,}", f"{avg:.3f} ± {std:.3f}"]
        label = "0 (random weights)" if m == 0 else f"{m:g}"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(points: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for t, pts in points.items():
        xs, _, ys, es = zip(*pts, strict=True)
        ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=t)
    ax.set_xlabel("pretraining budget (minutes; 0 = random weights)")
    ax.set_ylabel("downstream suite average (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--minutes", default="5,15,30", help="comma-separated budgets")
    p.add_argument("--trainers", default=",".join(TRAINERS), help=f"of {', '.join(TRAINERS)}")
    p.add_argument("--data-dir", required=True, help="as for bert-lightning downstream")
    p.add_argument("--tasks", default="sst2,cola,wnut17,home_depot")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--suite-budget", default="cpu", help="the suite's budget: cpu, gpu or a YAML")
    a, overrides = p.parse_known_args()
    minutes = [float(m) for m in a.minutes.split(",")]
    trainers = a.trainers.split(",")
    if unknown := [t for t in trainers if t not in TRAINERS]:
        p.error(f"--trainers {','.join(unknown)}: expected some of {', '.join(TRAINERS)}")
    a.out.mkdir(parents=True, exist_ok=True)
    models = [
        f"{t}_{m:g}min={pretrain(t, a.out / f'{t}_{m:g}min', m, overrides)}"
        for m in minutes
        for t in trainers
    ]
    report = downstream(
        models,
        a.tasks.split(","),
        a.data_dir,
        seeds=a.seeds,
        budget=a.suite_budget,
        out=str(a.out / "downstream"),
    )
    points = curve(report, minutes, a.out, trainers)
    write_json({"overrides": overrides, "tasks": a.tasks, "curve": points}, a.out / "curve.json")
    text = table(points)
    write_text(a.out / "curve.md", text + "\n")
    plot(points, a.out / "curve.png")
    print(text)


if __name__ == "__main__":
    main()
