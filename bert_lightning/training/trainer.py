"""The trainers: the one builder of both runs (pretraining and fine-tuning), and the bare one of
an evaluation or a prediction outside a run (`evaluation_trainer`). A run's: loggers and
callbacks are dicts of `_target_` entries in the `logger` / `callbacks` groups, instantiated
by one loop, then handed to the `trainer` group's Trainer. The progress bar and the model
summary are callbacks too (`callbacks/_progress.yaml`): the summary kept only where
`trainer.enable_model_summary` asks for it, the progress shown as lines, not a bar, where
`trainer.enable_progress_bar` is off."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import lightning as L
import torch
from hydra.errors import InstantiationException
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import ModelSummary, ProgressBar
from lightning.pytorch.utilities import rank_zero_only
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from bert_lightning.errors import UserError, first_line
from bert_lightning.run_folder import save_resolved_config
from bert_lightning.shipped import group_defaults
from bert_lightning.training.callbacks import EvalProgressBar, StepProgressBar
from bert_lightning.training.instantiate import instantiate

log = logging.getLogger(__name__)


class _Quiet(logging.Filter):
    """Lightning advertises its cloud logger at every Trainer construction, and announces that
    it keeps our model summary (`callbacks/_progress.yaml`) instead of its own."""

    NOISE = ("💡 Tip", "Trainer already configured with model summary callbacks")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


def silence_noise() -> None:
    """What a clean run would print that no user can act on, silenced by its exact text (at
    each build: a caller's `warnings.catch_warnings` may have reset the filters)."""
    # torchdata's StatefulDataLoader calls torch's deprecated `set_vital` on every construction
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
    # Lightning's pytree copy builds torch's deprecated LeafSpec (Lightning's to fix)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # our evaluation loaders count each row once under DDP (data/tables.py EvalBatches), and
    # their figures are torchmetrics', synced over the ranks: Lightning's hints say otherwise
    warnings.filterwarnings("ignore", message="Using `DistributedSampler` with the dataloaders")
    warnings.filterwarnings("ignore", message=r"It is recommended to use `self\.log\(.*sync_dist")
    rank_zero_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _Quiet) for f in rank_zero_log.filters):
        rank_zero_log.addFilter(_Quiet())


class SaveResolvedConfig(L.Callback):
    """`config_resolved.yaml` when the fit starts, once the data and the model are built: a run
    that failed before leaves none (it would look usable). Its `optim` is the optimizer that
    trains, the module's: a resumed run's is its checkpoint's (`resume.continued_optim`), and
    the schedule's total is filled in."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    @rank_zero_only
    def on_fit_start(self, trainer, pl_module):
        resolved = OmegaConf.to_container(self.cfg, resolve=True)
        resolved["optim"] = dict(pl_module.hparams.optim)
        text = OmegaConf.to_yaml(OmegaConf.create(resolved))
        save_resolved_config(text, Path(trainer.default_root_dir))


def evaluation_trainer(progress: bool, **hardware) -> L.Trainer:
    """The trainer of an evaluation or a prediction outside a run (`bert-lightning evaluate`;
    an index's vectors, training/predict.py): one device unless `hardware` (accelerator,
    devices, strategy) shards the rows over processes (a prediction's), no logger, checkpoint
    or summary; `progress`: ours, at a run's cadence (conf/callbacks/_progress.yaml), whose
    lines off a terminal read as a run's."""
    silence_noise()
    options = dict(group_defaults("callbacks", "_progress")["progress_bar"])
    options.pop("_target_")
    try:
        return L.Trainer(
            **{"accelerator": "auto", "devices": 1} | hardware,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=progress,
            callbacks=[EvalProgressBar(**options)] if progress else None,
        )
    except (MisconfigurationException, ValueError, TypeError) as e:  # a device or strategy refused
        raise UserError(f"trainer: {first_line(e)}") from e


def build_trainer(cfg: DictConfig) -> L.Trainer:
    """`cfg.trainer` with `cfg.logger` and `cfg.callbacks`; its root is the run folder."""
    silence_noise()
    loggers = [instantiate(c, f"logger.{k}") for k, c in (cfg.get("logger") or {}).items()]
    callbacks = [instantiate(c, f"callbacks.{k}") for k, c in (cfg.get("callbacks") or {}).items()]
    # Lightning refuses a progress bar callback when the bar is off, and adds its own when none
    # is given: that one counts epochs, which a step-bound run (max_epochs=-1) has no total of.
    # Off, ours keeps its lines (on a terminal too): a run is never silent for minutes
    bar = cfg.trainer.enable_progress_bar
    ours = [c for c in callbacks if isinstance(c, StepProgressBar)]
    if not bar and ours:
        for c in ours:
            c.tty = False
    elif not bar:
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    if not cfg.trainer.enable_model_summary:
        callbacks = [c for c in callbacks if not isinstance(c, ModelSummary)]
    # an int val_check_interval counts optimizer steps, as max_steps does; Lightning counts batches
    steps, per_step = cfg.trainer.val_check_interval, cfg.trainer.accumulate_grad_batches
    every = {"val_check_interval": steps * per_step} if isinstance(steps, int) else {}
    try:
        trainer = instantiate(
            cfg.trainer,
            "trainer",
            **every,
            logger=loggers,
            callbacks=[*callbacks, SaveResolvedConfig(cfg)],
            default_root_dir=str(cfg.paths.output_dir),
            enable_progress_bar=bool(bar or ours),
        )
    except InstantiationException as e:  # Lightning refusing a precision, a strategy, a device
        cause = e.__cause__
        if isinstance(cause, MisconfigurationException | ValueError | TypeError | ImportError):
            raise UserError(f"trainer: {first_line(cause)}") from e
        raise
    warn_emulated_bf16(trainer)
    say_no_gpu(cfg, trainer)
    return trainer


def say_no_gpu(cfg: DictConfig, trainer: L.Trainer) -> None:
    """`trainer.accelerator=auto` that found no GPU, asked for several devices (the card's
    `model=bert_base trainer.devices=8`): one line on what runs instead and why, and the
    learning rate and steps it runs with, which the user's command may not have chosen."""
    if cfg.trainer.accelerator != "auto" or not isinstance(trainer.accelerator, CPUAccelerator):
        return
    if trainer.num_devices < 2:
        return
    rank_zero_only(log.warning)(
        f"no GPU found: trainer.devices={trainer.num_devices} runs {trainer.num_devices} CPU "
        f"processes, precision {trainer.precision}, {cfg.trainer.max_steps} steps at lr "
        f"{cfg.optim.lr} (the schedule of the config given; BERT-base's recipe on C4: "
        "experiment=bert_base_c4; a CPU recipe: experiment=cpu_30min)"
    )


def cpu_bf16() -> bool:
    """Whether this CPU computes bf16 natively (avx512_bf16 or AMX); elsewhere bf16 is emulated
    and many times slower than fp32 (an AVX2 CPU: ~25x on a 512-wide matmul)."""
    caps = torch.cpu.get_capabilities()
    return bool(caps.get("avx512_bf16") or caps.get("amx_bf16"))


def warn_emulated_bf16(trainer: L.Trainer) -> None:
    """bf16 on a CPU without bf16 instructions (avx512_bf16 or AMX) is emulated: a step
    slower than fp32 where it is faster with them (docs/performance.md has the figures)."""
    precision = str(trainer.precision)
    if not isinstance(trainer.accelerator, CPUAccelerator) or not precision.startswith("bf16"):
        return
    if not cpu_bf16():
        rank_zero_only(log.warning)(
            f"trainer.precision={precision} on a CPU without bf16 instructions (no "
            "avx512_bf16, no AMX): emulated, several times slower than "
            "trainer.precision=32-true here"
        )
