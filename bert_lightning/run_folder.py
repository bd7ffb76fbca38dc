"""The run folder, in one place: where a run writes (`hydra.run.dir`, conf/_hydra.yaml, asks
`run_dir`), how a run is found again (a resume continues in its checkpoint's folder, one that
moved too), what marks a run that failed (`FAILED`), its record (`config_resolved.yaml`) and
its metrics (`metrics.csv`, cut back to the step a resume continues from).

    <run>/
      .hydra/  <job>.log       Hydra's (a resume in place keeps the first run's .hydra/)
      config_resolved.yaml     what ran, every interpolation filled (written when the fit starts)
      metrics.csv              every logged step once, in order, across resumes
      checkpoints/             last.ckpt, best-step<N>.ckpt
      FAILED                   the one-line reason of a run that raised"""

from __future__ import annotations

import csv
import logging
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from bert_lightning.atomic import atomic_path, write_text
from bert_lightning.errors import UserError, first_line, reported, user_error
from bert_lightning.progress import to_log_files

log = logging.getLogger(__name__)

RESOLVED = "config_resolved.yaml"
METRICS = "metrics.csv"
CHECKPOINTS = "checkpoints"
FAILED = "FAILED"


def run_folder_of(ckpt_path: str | os.PathLike) -> Path | None:
    """The run folder a checkpoint of ours sits in (`<run>/checkpoints/last.ckpt`), else None
    (a checkpoint copied elsewhere, or a path that is not a file: a new folder then)."""
    path = Path(ckpt_path)
    return path.parent.parent if path.is_file() and path.parent.name == CHECKPOINTS else None


def entry_point(folder: Path) -> str | None:
    """`finetune` or `train`: the entry point whose run wrote `folder` (its resolved config
    has a task or not); None when it has none yet."""
    path = folder / RESOLVED
    if not path.is_file():
        return None
    try:  # plain YAML: no resolver of OmegaConf's runs (a file someone else made)
        record = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"{path}: not a YAML file ({first_line(e)})") from None
    return "finetune" if isinstance(record, dict) and "task" in record else "train"


def resumed_run(ckpt_path: str | None, entry: str | None = None) -> str | None:
    """The run folder a resumed run continues in: the checkpoint's own, when it sits in
    `<run>/checkpoints/` of a run of this `entry` point (another entry point's run is refused
    without being written to)."""
    folder = run_folder_of(ckpt_path) if ckpt_path else None
    if folder is None or (entry and entry_point(folder) not in (None, entry)):
        return None
    return str(folder)


def run_dir(ckpt_path: str | None, entry: str, overrides: list[str], default: str) -> str:
    """Hydra's run folder (`hydra.run.dir`): `paths.output_dir=` given on the command line
    (the whole run goes there: log and `.hydra/` too), else the run a checkpoint resumes,
    else the dated default. A resume into the checkpoint's own folder is refused there when
    the folder holds a symlink (`refuse_links`)."""
    resumed = resumed_run(ckpt_path, entry)
    folder = resumed or default
    for o in overrides:
        key, _, value = o.lstrip("+").partition("=")
        if key == "paths.output_dir" and value:
            folder = value.strip("'\"")
            break
    if resumed and Path(folder).resolve() == Path(resumed).resolve():
        # Hydra writes its log there before the task runs, whose mistakes are one line (exit
        # 2): this one is reported as such here
        with reported():
            refuse_links(Path(resumed))
    return folder


def refuse_links(
    folder: Path,
    what: str = "the run folder this resume writes into",
    fix: str = "continue the run in another folder with paths.output_dir=NEW",
) -> None:
    """A run folder is data (downloaded, shared), and a resume writes into it: the CSV logger's
    `hparams.yaml`, Hydra's log (appended), checkpoints, metrics. A symlink anywhere in it
    would take those writes to a file elsewhere (`hparams.yaml -> ~/.bashrc`), a hard link
    append to the file it shares: refused before anything is written."""
    link = next(links_in(folder), None)
    if link is not None:
        if link.is_symlink():
            kind = f"a symlink (to {os.path.realpath(link)})"
        else:
            kind = "a hard link" if link.is_file() else "not a regular file (a reader would wait)"
        raise UserError(f"{link}: {kind} in {what}; remove it, or {fix}")


def links_in(folder: Path) -> Iterator[Path]:
    """The symlinks at or under `folder`, files of more than one name (hard links) and what is
    neither a file nor a folder (a FIFO, on which a reader waits forever), in a fixed order,
    none followed."""
    if folder.is_symlink():
        yield folder
        return
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(dirs + files):
            path = Path(root, name)
            odd = name in files and (not path.is_file() or path.stat().st_nlink > 1)
            if path.is_symlink() or odd:
                yield path


def hydra_subdir(ckpt_path: str | None, entry: str, run: str) -> str | None:
    """Hydra's record folder (`hydra.output_subdir`): a run continued in its own folder keeps
    the first run's `.hydra/`, a run anywhere else gets its own."""
    return None if resumed_run(ckpt_path, entry) == str(run) else ".hydra"


def hydra_run_dir() -> Path | None:
    """The folder Hydra made for this job; None outside a Hydra job (tests, notebooks)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    folder = OmegaConf.select(HydraConfig.get(), "runtime.output_dir", throw_on_missing=False)
    return Path(folder) if folder else None


def drop_unused_folder(out_dir: Path) -> None:
    """The folder Hydra made for a job that wrote nothing of its own (a resume with nothing
    left to do, a refused one), holding only `.hydra/` and the job's log, removed: a run that
    did nothing leaves no folder behind, nor the folders of the default run path
    (`<paths.log_dir>/<task_name>/runs/`) that it alone made."""
    folder = Path(out_dir)
    if hydra_run_dir() != folder or not folder.is_dir():
        return
    if all(p.name == ".hydra" or (p.suffix == ".log" and p.is_file()) for p in folder.iterdir()):
        shutil.rmtree(folder)
        if folder.parent.name == "runs":
            for parent in folder.parents[:3]:
                if any(parent.iterdir()):
                    break
                parent.rmdir()


def save_resolved_config(text: str, out_dir: Path) -> None:
    """`config_resolved.yaml`: what ran, every interpolation filled (`text`, the config's YAML:
    the run folder holds it, never reads the config)."""
    write_text(Path(out_dir) / RESOLVED, text)


def keep_metrics_through(out_dir: Path, step: int | None) -> None:
    """Drops the rows of the run's `metrics.csv` after `step`: a run continued from a
    checkpoint at `step` logs them again (a crashed run may have logged past its last
    checkpoint), so that the file holds every step once, in order. `None` (a fresh run)
    empties it."""
    keep_metrics(out_dir, lambda r: step is not None and r.get("step") and int(r["step"]) <= step)


def drop_phase_metrics(out_dir: Path, prefix: str) -> None:
    """Drops the rows of the run's `metrics.csv` holding a metric named `prefix...`: those of
    a phase after the fit (fine-tuning's `test/`) that a resumed run redoes from its start,
    which a run stopped later in that phase (in the baselines) logged."""
    keep_metrics(out_dir, lambda r: not any(v and k.startswith(prefix) for k, v in r.items()))


def keep_metrics(out_dir: Path, keep) -> None:
    """The rows of the run's `metrics.csv` that `keep(row)`, the file removed when none is."""
    metrics_csv = Path(out_dir) / METRICS
    if not metrics_csv.is_file():
        return
    with open(metrics_csv, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames or [], list(reader)
    kept = [r for r in rows if keep(r)]
    if not kept:
        metrics_csv.unlink()
        return
    with atomic_path(metrics_csv) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(kept)


class RunState:
    """`begun`: the run has started writing its own results (set just before the fit)."""

    begun = False


@contextmanager
def failure_marked(out_dir: Path, resuming: bool, rank: int) -> Iterator[RunState]:
    """A run that raises leaves `FAILED` (its one-line reason, as printed, also the log's last
    line) beside its log; one that
    completes removes the marker of the crashed run it continued. A user's mistake found
    before the run begins writes nothing: a refused resume leaves the run it names as it was,
    and a folder Hydra made for this job is removed. Only `rank` 0 writes."""
    state, out_dir = RunState(), Path(out_dir)
    try:
        yield state
    except BaseException as e:
        if rank == 0:
            refused = not state.begun and user_error(e) is not None
            if refused:
                drop_unused_folder(out_dir)
            if not (refused and (resuming or not out_dir.exists())):
                mistake = user_error(e)  # its line as printed: `stopped on request: ...`
                line = f"{mistake.label}: {first_line(mistake)}" if mistake else None
                line = line or f"{type(e).__name__}: {first_line(e)}"
                to_log_files(line)
                with suppress(UserError):  # a folder it cannot write: the error says why
                    write_text(out_dir / FAILED, line + "\n")
        raise
    if rank == 0:
        (out_dir / FAILED).unlink(missing_ok=True)


@contextmanager
def own_checkpoints_expected(ckpt_path: str | None) -> Iterator[None]:
    """A run continued in its own folder finds its checkpoints there: Lightning's warning
    about a non-empty checkpoint folder is then expected, and silenced for that folder only."""
    with warnings.catch_warnings():
        if ckpt_path:
            folder = re.escape(str(Path(ckpt_path).resolve().parent))
            warnings.filterwarnings(
                "ignore", message=f"Checkpoint directory {folder} exists and is not empty"
            )
        yield


def follow_moved_run(state: dict, dirpath: str, ckpt_path: str) -> None:
    """A run folder moved or copied since its checkpoint was written (the checkpoint resumed
    sits in the folder the run now writes to, `dirpath`): the checkpoint callback's `state`
    names the old folder, and Lightning would keep none of it (`last-v1.ckpt` written beside
    `last.ckpt`, the best forgotten). Its paths become those of the folder the run continues
    in. A run continued into another folder keeps them (the old folder still holds its best)."""
    old = state.get("dirpath")
    if not old or old == dirpath or Path(ckpt_path).resolve().parent != Path(dirpath).resolve():
        return

    def moved(path):  # a file of the old folder (checkpoint.check_checkpoint_paths)
        return os.path.join(dirpath, os.path.basename(path)) if path else path

    for k in ("best_model_path", "kth_best_model_path", "last_model_path"):
        state[k] = moved(state.get(k))
    state["best_k_models"] = {moved(p): v for p, v in state.get("best_k_models", {}).items()}
    state["dirpath"] = dirpath
    log.info("the run moved from %s: it continues in %s", Path(old).parent, Path(dirpath).parent)
