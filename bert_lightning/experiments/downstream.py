"""The downstream suite: every model fine-tuned on every task, over several seeds, on one fixed
budget per task (`experiments/budgets/<budget>.yaml`), beside the same shapes from random weights;
`downstream.md`, `downstream.json` and `downstream.png` say what pretraining bought.

Each cell (model, task, seed) is an ordinary fine-tuning run folder,
`<out>/cells/<model>/<task>/seed<s>/`, keyed (`cell_key.json`) by what its results depend on: the
start's weights by content, its settings, the files it reads. One holding `results.json` under
the key the suite now gives it is finished and not re-run, so an interrupted suite continues
where it stopped; under another key (another checkpoint, budget or data) it runs again. Cells
run a seed at a time, so a suite stopped part-way leaves whole seeds, and seeds can be split over
machines or sessions (`--seeds 2,3`)."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bert_lightning.atomic import write_json, write_text
from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.data.tokenizer import save_tokenizer
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.fields import from_dict
from bert_lightning.fingerprints import file_digest, file_stamps, fingerprint
from bert_lightning.progress import Waiting, eta_text
from bert_lightning.run_folder import refuse_links
from bert_lightning.training.callbacks import save_figure
from bert_lightning.training.finetune import finetune

# BertConfig fields that do not shape a model (the random row keeps the rest): the random row
# starts from BERT's init, whatever init a pretraining run started from
BUDGETS = Path(__file__).parent / "budgets"  # cpu.yaml, gpu.yaml: --budget NAME
KEY = "cell_key.json"  # in a cell's folder: what it runs with (`cell_key`)
NOT_SHAPE = ("vocab_size", "pad_token_id", "position_embedding_init")
QUIET = ("lightning.pytorch", "lightning.fabric")  # their console lines, kept in each cell's log
RANKING_PER_QUERY = ("query_spearman", "ndcg@10")  # --ranking: gains within each query, paired
RANKING_GLOBAL = ("spearman", "auroc")


@dataclass(frozen=True)
class TaskBudget:
    dataset: str  # the conf/dataset/ preset
    folder: str  # its files' folder under --data-dir
    metric: str  # the test metric the table shows (results.json's test/<metric>)
    label: str  # the table's column
    rows: int | None  # training rows (task.subsample.train); null: the whole train part
    validation_rows: int
    test_rows: int | None  # null: the whole test part
    epochs: int
    lr: float
    max_seq_length: int
    batch_size: int
    overrides: list = field(default_factory=list)


@dataclass(frozen=True)
class Model:
    name: str
    overrides: tuple[str, ...]  # what starts it: init_from=..., or random weights of a shape
    source: str
    digest: str  # its weights by content (`file_digest`); random weights: its tokenizer's


def load_budget(name_or_path: str) -> tuple[list[str], dict[str, TaskBudget]]:
    """`cpu`, `gpu` (experiments/budgets/) or a YAML file of the same form."""
    path = Path(name_or_path)
    if not path.suffix:
        path = BUDGETS / f"{name_or_path}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in BUDGETS.glob("*.yaml"))
        raise MissingFileError(
            f"--budget {name_or_path}: no such budget (one of {known}, or a YAML)"
        )
    raw = OmegaConf.to_container(OmegaConf.load(path))  # `${...}`: the cell's config resolves
    tasks = {k: from_dict(TaskBudget, v, f"{path}: tasks.{k}") for k, v in raw["tasks"].items()}
    return list(raw.get("overrides") or []), tasks


def model_name(path: str) -> str:
    p = Path(path)
    if p.suffix == ".ckpt":  # <run>/checkpoints/last.ckpt: the run's name
        return p.parent.parent.name if p.parent.name == "checkpoints" else p.stem
    return p.name


def pretrained_models(specs: list[str], out: Path, random: bool) -> list[Model]:
    """`NAME=PATH` or `PATH` (named after its run or folder) -> the models, plus one `random`
    row per distinct shape and tokenizer (random weights, fine-tuned on the same budget)."""
    models, shapes = [], {}
    for spec in specs:
        name, _, path = spec.partition("=") if "=" in spec else (model_name(spec), "", spec)
        ckpt = read_checkpoint(path)
        models.append(Model(name, (f"init_from={path}",), ckpt.source, file_digest(path)))
        shape = {k: v for k, v in asdict(ckpt.config).items() if k not in NOT_SHAPE}
        key = fingerprint(shape, ckpt.tokenizer.to_str())
        shapes.setdefault(key, (name, shape, ckpt.tokenizer))
    names = [m.name for m in models]
    if len(set(names)) != len(names) or "random" in names:
        raise UserError(f"model names {names}: give each its own (NAME=PATH), none 'random'")
    if not random:
        return models
    for key, (like, shape, tok) in shapes.items():
        name = "random" if len(shapes) == 1 else f"random-{like}"
        tok_path = out / "random" / key / "tokenizer.json"
        if not tok_path.is_file():
            save_tokenizer(tok, tok_path)
        model = tuple(f"model.{k}={v}" for k, v in shape.items())
        source = f"random weights, {like}'s shape"
        models.append(
            Model(name, (f"data.tokenizer.path={tok_path}", *model), source, file_digest(tok_path))
        )
    return models


def null(n: int | None) -> str:
    return "null" if n is None else str(n)


def cell_overrides(common, task: TaskBudget, data_dir: Path, seed: int, folder: Path):
    return [
        f"dataset={task.dataset}",
        f"data_dir={data_dir / task.folder}",
        f"seed={seed}",
        f"paths.output_dir={folder}",
        f"task.subsample.train={null(task.rows)}",
        f"task.subsample.validation={task.validation_rows}",
        f"task.subsample.test={null(task.test_rows)}",
        f"trainer.max_epochs={task.epochs}",
        f"optim.lr={task.lr}",
        f"data.max_seq_length={task.max_seq_length}",
        f"data.batch_size={task.batch_size}",
        *common,
        *task.overrides,
    ]


@contextmanager
def cell_log(path: Path) -> Iterator[None]:
    """The cell's log lines (ours, Lightning's, Python warnings) go to its `train.log`, not
    the console, where the suite prints one line per cell."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
    root = logging.getLogger()
    loggers = [root, *(logging.getLogger(n) for n in QUIET)]
    consoles = [h for lg in loggers[1:] for h in lg.handlers]
    saved = root.level, [h.level for h in consoles]
    root.setLevel(logging.INFO)
    for h in consoles:
        h.setLevel(logging.WARNING)
    for lg in loggers:
        lg.addHandler(handler)
    logging.captureWarnings(True)
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for lg in loggers:
            lg.removeHandler(handler)
        handler.close()
        root.setLevel(saved[0])
        for h, level in zip(consoles, saved[1], strict=True):
            h.setLevel(level)


def seed_list(seeds: int | str) -> list[int]:
    """`3` is seeds 1..3; `2,3` is those seeds."""
    text = str(seeds)
    try:
        values = [int(v) for v in text.split(",")] if "," in text else list(range(1, int(text) + 1))
    except ValueError:
        values = []
    if not values or min(values) < 1 or len(set(values)) < len(values):
        raise UserError(f"--seeds {text}; expected at least 1, or distinct seeds like 2,3")
    return values


def cell_folder(out: Path, model: Model, task: str, seed: int) -> Path:
    return out / "cells" / model.name / task / f"seed{seed}"


def cell_key(model: Model, cfg: DictConfig) -> dict[str, str]:
    """What a cell's results depend on, part by part (a changed part re-runs it, and is named):
    the start's `weights` (and the soft labels' encoder's) by content; its `settings`, the
    composed config as written (`${...}` unresolved: not this machine's core count) but where it
    writes; the `data` files its task reads, by path, size and time."""
    settings = OmegaConf.to_container(cfg)
    settings.pop("paths")
    encoder = cfg.soft_labels.encoder
    files = [cfg.task[k] for k in sorted(cfg.task) if k.endswith("_file") and cfg.task[k]]
    return {
        "weights": fingerprint(
            model.digest, file_digest(encoder) if encoder and encoder != cfg.init_from else None
        ),
        "settings": fingerprint(settings),
        "data": fingerprint(file_stamps(f for f in files if os.path.isfile(f))),
    }


def rerun_reason(folder: Path, key: dict) -> str | None:
    """None: `folder` holds a cell finished under `key`, to reuse. Else why it runs: "" when it
    never finished, or what it finished with that differs now."""
    if not (folder / "results.json").is_file():
        return ""
    if not (folder / KEY).is_file():
        return "finished without a record of what it ran with"
    ran = json.loads((folder / KEY).read_text())
    changed = [part for part in key if ran.get(part) != key[part]]
    return f"finished with other {', '.join(changed)}" if changed else None


def run_cell(cfg: DictConfig, key: dict, folder: Path) -> dict:
    """One fine-tuning run into `folder`, under `key`; a half-done one (no results.json) or one
    of another key starts over."""
    if folder.exists():
        shutil.rmtree(folder)
    write_json(key, folder / KEY)
    with cell_log(folder / "train.log"):
        return finetune(cfg)


def score(results: dict, metric: str) -> float:
    """The cell's test metric; NaN (a correlation of constant scores) stays NaN: a 0 would
    pass for a measured figure in the means."""
    return results["test"][f"test/{metric}"]


def mean_std(values: list[float]) -> tuple[float, float]:
    """NaN and NaN where a value is NaN: a mean of the others would be of fewer cells than
    its neighbours' (and `statistics.stdev` fails on a NaN)."""
    if any(math.isnan(v) for v in values):
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarise(models, tasks: dict[str, TaskBudget], seeds, scores) -> dict:
    """Mean and std over seeds per task, and of the per-seed average over tasks; NaN where a
    cell they take in is NaN (`mean_std`)."""
    out = {}
    for m in models:
        per_task = {t: [scores[m.name, t, s] for s in seeds] for t in tasks}
        averages = [statistics.fmean(per_task[t][i] for t in tasks) for i in range(len(seeds))]
        out[m.name] = {
            "source": m.source,
            "digest": m.digest,
            "cells": {t: dict(zip(map(str, seeds), v, strict=True)) for t, v in per_task.items()},
            "mean_std": {t: mean_std(v) for t, v in per_task.items()},
            "average": mean_std(averages),
        }
    return out


def table(summary: dict, tasks: dict[str, TaskBudget], seeds) -> str:
    def cell(m, s):
        if math.isnan(m):
            return "nan"
        return f"{m:.3f} ± {s:.3f}" if len(seeds) > 1 else f"{m:.3f}"

    head = ["model", *(t.label for t in tasks.values()), "average"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for name, row in summary.items():
        cells = [cell(*row["mean_std"][t]) for t in tasks] + [cell(*row["average"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ranking_table(out: Path, against: str, cells: list[Path] | None = None) -> str:
    """The cells of `out` that rank (ad relevance: results.json has `ranking`; `cells`: of those
    folders alone, a suite's own), per model and task: per-query Spearman and NDCG@10 minus
    `against` (zero_shot or bm25) on the same test queries (over seeds: mean ± std and in how
    many seeds the paired 95% bootstrap interval lies above 0; of one seed: its interval),
    beside the global Spearman and AUROC (means)."""
    found: dict = {}
    paths = (
        Path(out).glob("cells/*/*/seed*/results.json")
        if cells is None
        else (c / "results.json" for c in cells)
    )
    for path in sorted(paths):
        results = json.loads(path.read_text())
        if "ranking" not in results:
            continue
        if f"fine-tuned - {against}" not in results["ranking"]:
            have = [k.removeprefix("fine-tuned - ") for k in results["ranking"] if " - " in k]
            raise UserError(f"--ranking {against}: {path} has none (it has {', '.join(have)})")
        paired = results["ranking"][f"fine-tuned - {against}"]
        if missing := [m for m in RANKING_PER_QUERY if m not in paired]:
            raise UserError(
                f"--ranking: {path} has no {missing[0]} (a cell written before the per-query "
                "correlations were named query_*); run it again"
            )
        found.setdefault((path.parts[-4], path.parts[-3]), []).append(results)
    if not found:
        raise UserError(f"--ranking: no finished cell of {out} ranks (ad relevance tasks do)")
    head = ["start", "arm", "seeds"]
    head += [f"{m} minus {against}" for m in RANKING_PER_QUERY]
    head += [f"global {m}" for m in RANKING_GLOBAL]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += [ranking_row(s, a, runs, against) for (s, a), runs in found.items()]
    return "\n".join(lines)


def ranking_row(start: str, arm: str, runs: list[dict], against: str) -> str:
    cells = [start, arm, str(len(runs))]
    for m in RANKING_PER_QUERY:
        diffs = [r["ranking"][f"fine-tuned - {against}"][m] for r in runs]
        if len(diffs) == 1:
            d = diffs[0]
            cells.append(f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]")
        else:
            mean, sd = mean_std([d["mean"] for d in diffs])
            above = sum(d["low"] > 0 for d in diffs)
            cells.append(f"{mean:+.4f} ± {sd:.4f} ({above}/{len(diffs)} above 0)")
    for m in RANKING_GLOBAL:
        cells.append(f"{statistics.mean(r['test'][f'test/{m}'] for r in runs):.4f}")
    return "| " + " | ".join(cells) + " |"


def plot(summary: dict, tasks: dict[str, TaskBudget], path: Path) -> None:
    """Grouped bars: one group per task (and the average), one bar per model, std as error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [*(t.label for t in tasks.values()), "average"]
    width = 0.8 / max(1, len(summary))
    fig, ax = plt.subplots(figsize=(1.6 * len(groups) + 2, 4))
    for i, (name, row) in enumerate(summary.items()):
        ms = [row["mean_std"][t] for t in tasks] + [row["average"]]
        xs = [g + (i - (len(summary) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [m for m, _ in ms], width, yerr=[s for _, s in ms], capsize=3, label=name)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("test metric (mean over seeds)")
    ax.axhline(0, color="black", linewidth=0.5)
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)
    plt.close(fig)


def downstream(
    specs: list[str],
    task_names: list[str] | None,
    data_dir: str,
    *,
    seeds: int | str,
    budget: str,
    out: str,
    random: bool,
    ranking: str | None = None,
) -> dict:
    """Runs the cells not finished under their key (`cell_key`), then writes the table, JSON
    and chart into `out`. `task_names` None: every task of the budget, in its order; `ranking`
    (zero_shot or bm25): the suite's ranking cells' table against that baseline too."""
    out_dir, data = Path(out), Path(data_dir)
    if out_dir.exists():  # cells are removed and written again in it
        refuse_links(out_dir, f"--out {out_dir}", "give a new --out")
    common, budgets = load_budget(budget)
    task_names = list(budgets) if task_names is None else task_names
    unknown = [t for t in task_names if t not in budgets]
    if unknown:
        raise UserError(
            f"--tasks {','.join(unknown)}: not in budget {budget} ({', '.join(budgets)})"
        )
    tasks = {t: budgets[t] for t in task_names}
    for t in tasks.values():
        if not (data / t.folder).is_dir():
            raise MissingFileError(
                f"--data-dir {data}: no folder {t.folder}/ (the {t.dataset} files)"
            )
    seeds = seed_list(seeds)
    models = pretrained_models(specs, out_dir, random)
    cells = [(m, t, s) for s in seeds for m in models for t in tasks]
    folders = {c: cell_folder(out_dir, *c) for c in cells}
    configs = {
        (m, t, s): compose(
            "finetune", [*m.overrides, *cell_overrides(common, tasks[t], data, s, f)]
        )
        for (m, t, s), f in folders.items()
    }
    keys = {c: cell_key(c[0], cfg) for c, cfg in configs.items()}
    reasons = {c: rerun_reason(folders[c], keys[c]) for c in cells}
    scores, spent = {}, {}
    for i, c in enumerate(cells, 1):
        (m, t, s), folder = c, folders[c]
        if reasons[c] is None:
            results = json.loads((folder / "results.json").read_text())
            scores[m.name, t, s] = score(results, tasks[t].metric)
            continue
        head = f"[{i}/{len(cells)}] {m.name} {t} seed {s}"
        if reasons[c]:
            print(f"{head}: {reasons[c]}: re-running", flush=True)
        start = time.perf_counter()
        with Waiting(f"{head}: fine-tuning"):  # a quiet cell: its time, not its steps
            value = score(run_cell(configs[c], keys[c], folder), tasks[t].metric)
        scores[m.name, t, s] = value
        spent.setdefault(t, []).append(time.perf_counter() - start)
        left = sum(
            statistics.fmean(spent.get(c2[1]) or [x for v in spent.values() for x in v])
            for c2 in cells[i:]
            if reasons[c2] is not None
        )
        print(
            f"{head}: {tasks[t].metric} {value:.4f} ({spent[t][-1]:.0f} s; eta {eta_text(left)})",
            flush=True,
        )
    summary = summarise(models, tasks, seeds, scores)
    report = {
        "budget": budget,
        "seeds": seeds,
        "tasks": {k: asdict(v) for k, v in tasks.items()},
        "models": summary,
    }
    text = table(summary, tasks, seeds)
    if ranking:
        text += "\n\n" + ranking_table(out_dir, ranking, list(folders.values()))
    write_json(report, out_dir / "downstream.json")
    write_text(out_dir / "downstream.md", text + "\n")
    plot(summary, tasks, out_dir / "downstream.png")
    print(text)
    return report
