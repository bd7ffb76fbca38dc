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
continue: a finished pretraining run and a finished cell of the same settings are not redone
(other overrides run them again), and a run of ours that was stopped continues from its
`last.ckpt` with what is left of its budget. Run nothing else on the machine meanwhile: a
budget is wall time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from budget_runs import TRAINERS, pretrain, steps_taken

from bert_lightning.atomic import write_json, write_text
from bert_lightning.experiments.downstream import downstream
from bert_lightning.training.callbacks import save_figure


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
        random=True,
    )
    points = curve(report, minutes, a.out, trainers)
    write_json({"overrides": overrides, "tasks": a.tasks, "curve": points}, a.out / "curve.json")
    text = table(points)
    write_text(a.out / "curve.md", text + "\n")
    plot(points, a.out / "curve.png")
    print(text)


if __name__ == "__main__":
    main()
