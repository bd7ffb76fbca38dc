"""`run(cfg, entry)`: the one skeleton of a pretraining and of a fine-tuning run, so that both
refuse, resume, seed, keep their metrics and fail in the same order. An `Entry` gives what
differs: which checkpoint `ckpt_path=` continues, how the three Lightning objects are built,
and what follows the fit (and whether it ran)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from bert_lightning.checkpoint import ResumePoint, resume_point
from bert_lightning.errors import UserError
from bert_lightning.progress import cadence
from bert_lightning.run_folder import failure_marked, keep_metrics_through, own_checkpoints_expected
from bert_lightning.shipped import GLOBAL, global_groups, global_keys, root_keys
from bert_lightning.signals import stops_on_signals
from bert_lightning.training.instantiate import required
from bert_lightning.training.lightning_api import count_the_fit_done
from bert_lightning.training.resume import already_done

Built = tuple[L.LightningDataModule, L.LightningModule, L.Trainer]


@dataclass(frozen=True)
class Entry:
    """`checkpoint`: what `ckpt_path=` must be (`checkpoint.PRETRAINING`, ...), `use`: what
    reads it, for the message of another one; `build(cfg, resume)`: data module, module and
    trainer, before any step (`resume`: the checkpoint a resumed run continues, else None);
    `after_fit(cfg, dm, module, trainer)`: what the run returns; `finished(cfg, step)`: whether
    `after_fit` ran to its end after the fit that ended at `step` (else a resume of that fit
    runs it again: resume.py `already_done`); `configs`: this entry point's root config
    (`train`, `finetune`) and the other's."""

    checkpoint: str
    use: str
    build: Callable[[DictConfig, ResumePoint | None], Built]
    after_fit: Callable[[DictConfig, L.LightningDataModule, L.LightningModule, L.Trainer], Any]
    finished: Callable[[DictConfig, int], bool]
    configs: tuple[str, str]


def stray_key(node: DictConfig, own: dict, prefix: str = "") -> str | None:
    """The first key of `node` (the composed config, or a plain node of it) that `own` (what
    the root config gives there) has not; a group's keys are its options' business."""
    for k in node:
        if k not in own:
            return f"{prefix}{k}"
        plain = isinstance(own[k], dict) and isinstance(node[k], DictConfig)
        if plain and (stray := stray_key(node[k], own[k], f"{prefix}{k}.")):
            return stray
    return None


def refuse_stray_keys(cfg: DictConfig, configs: tuple[str, str]) -> None:
    """A key that this entry point's configs do not have is set by an experiment or a config
    file of the other entry point (which would run half-applied), by an option of a `_global_`
    group written without that first line (its keys land under the group's name), or by
    nobody's: refused either way, never composed and then ignored (a name a release retired, a
    misspelt one)."""
    own, other = (root_keys(c) for c in configs)
    grouped = global_groups()
    allowed = {k: v for k, v in own.items() if k not in grouped}
    allowed |= dict.fromkeys(global_keys() - set(other))
    if (stray := stray_key(cfg, allowed)) is None:
        return
    entry, theirs = (f"{c}.py" for c in configs)
    top = stray.partition(".")[0]
    if top in grouped:
        raise UserError(
            f"{stray}: set under `{top}`, whose options set keys at the top: a file of "
            f"{top}/ whose first line is not `{GLOBAL}`?"
        )
    if top in other and top not in own:
        raise UserError(
            f"{stray}: a key of {theirs}'s configs (an experiment of {theirs}? its file's first "
            f"lines give its command: python {theirs} experiment=...)"
        )
    raise UserError(
        f"{stray}: not a key of {entry}'s configs (docs/config-keys.md lists them; an "
        f"experiment of {theirs}? its file's first lines give its command)"
    )


def run(cfg: DictConfig, entry: Entry) -> Any:
    """One run of `entry` from a composed Hydra config: what `entry.after_fit` returns, None when
    a resumed run had nothing left to do. `validate_before_fit=true` logs the validation loss
    at step 0 (a fresh run's only: the starting point of its loss curve)."""
    out_dir = Path(cfg.paths.output_dir)
    refuse_stray_keys(cfg, entry.configs)
    with (
        failure_marked(out_dir, bool(cfg.ckpt_path), rank_zero_only.rank) as state,
        stops_on_signals("before training began: nothing saved"),  # the fit defers them
        cadence(OmegaConf.select(cfg, "callbacks.progress_bar.seconds")),
    ):
        required(cfg)
        resume = resume_point(cfg.ckpt_path, entry.checkpoint, entry.use) if cfg.ckpt_path else None
        if already_done(cfg, resume, entry.finished):
            return None
        L.seed_everything(cfg.seed, workers=True)
        dm, module, trainer = entry.build(cfg, resume)
        state.begun = True
        if rank_zero_only.rank == 0:  # before fit launches any other rank
            keep_metrics_through(out_dir, resume.step if resume else None)
        if cfg.get("validate_before_fit") and resume is None:
            # the progress bar prints its own line
            trainer.validate(module, datamodule=dm, verbose=not cfg.trainer.enable_progress_bar)
        with own_checkpoints_expected(cfg.ckpt_path):
            trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
        if resume is not None and trainer.global_step == resume.step:  # nothing was left to train
            count_the_fit_done(trainer)
        return entry.after_fit(cfg, dm, module, trainer)
