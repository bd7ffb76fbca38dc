"""The one trainer builder of both runs (pretraining and fine-tuning): loggers and callbacks
are dicts of `_target_` entries in the `logger` / `callbacks` groups, instantiated by one loop,
then handed to the `trainer` group's Trainer."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from bert_lightning.atomic import write_text


def build_trainer(cfg: DictConfig) -> L.Trainer:
    """`cfg.trainer` with `cfg.logger` and `cfg.callbacks`; its root is the run folder."""
    loggers = [instantiate(c) for c in (cfg.get("logger") or {}).values()]
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values()]
    return instantiate(
        cfg.trainer,
        logger=loggers,
        callbacks=callbacks,
        default_root_dir=str(cfg.paths.output_dir),
    )


@rank_zero_only
def save_resolved_config(cfg: DictConfig, out_dir: Path) -> None:
    """`config_resolved.yaml` in the run folder: what ran, with every interpolation filled."""
    write_text(Path(out_dir) / "config_resolved.yaml", OmegaConf.to_yaml(cfg, resolve=True))
