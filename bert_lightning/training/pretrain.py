"""`train(cfg)`: one pretraining run from a composed Hydra config (`train.py`,
`bert-lightning pretrain` and tests call it), through the run skeleton (training/run.py): what
pretraining builds (the corpus's data module, the model, the trainer) and what follows its fit
(the validation loss returned)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bert_lightning.checkpoint import PRETRAINING, ResumePoint
from bert_lightning.training.instantiate import check_types, instantiate
from bert_lightning.training.resume import continued_optim
from bert_lightning.training.run import Entry, run
from bert_lightning.training.start import run_start
from bert_lightning.training.trainer import build_trainer
from bert_lightning.weights import load_start

log = logging.getLogger(__name__)


def build(cfg: DictConfig, resume: ResumePoint | None = None):
    """Data module, Lightning module and trainer of a run, before any training, from its start
    (`run_start`: weights, tokenizer, shape, teacher). `resume`: the checkpoint a resumed run
    continues (its schedule here; `run_start` checks the rest against it)."""
    check_types(cfg.optim, "optim")  # built by the trainer, once the corpus is read
    dm = instantiate(cfg.data, "data", out_dir=str(Path(cfg.paths.output_dir)))
    start = run_start(cfg, resume, dm)
    log.info("the run starts from %s", start)
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    module = instantiate(cfg.objective, "objective")(
        config=asdict(start.config),
        optim=continued_optim(optim, resume, cfg.trainer.max_steps),
        tokenizer_json=start.tokenizer.to_str(),
        compile=cfg.model_compile,
        nsp=dm.nsp,
        data_record=dm.data_record(),
        **(
            {"teacher_ckpt": start.teacher, "teacher_digest": start.teacher_digest}
            if start.teacher is not None
            else {}
        ),
    )
    if start.weights is not None:
        load_start(module.model, start.weights)
    return dm, module, build_trainer(cfg)


def after_fit(cfg: DictConfig, dm, module, trainer) -> float | None:
    """The last validation loss: what a sweep minimises."""
    val_loss = trainer.callback_metrics.get("val/loss")
    log.info("outputs in %s", Path(cfg.paths.output_dir))
    return float(val_loss) if val_loss is not None else None


def finished(cfg: DictConfig, step: int) -> bool:
    """Always: what follows a pretraining fit writes nothing (`after_fit` reads its last
    validation), so a fit that ended leaves nothing to redo."""
    return True


PRETRAINING_RUN = Entry(
    PRETRAINING,
    "ckpt_path (resuming a pretraining run)",
    build,
    after_fit,
    finished,
    ("train", "finetune"),
)


def train(cfg: DictConfig) -> float | None:
    """The last validation loss; None when a resumed run had nothing left to do."""
    return run(cfg, PRETRAINING_RUN)
