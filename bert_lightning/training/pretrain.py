"""`train(cfg)`: one pretraining run from a composed Hydra config (`train.py`,
`bert-lightning pretrain` and tests call it)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from bert_lightning.checkpoint import PRETRAINING, ResumePoint, resume_point
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.errors import UserError
from bert_lightning.fields import check_types, instantiate, required
from bert_lightning.training.optim import budget_timer
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.resume import (
    already_done,
    check_same_model,
    continued_optim,
    failure_marked,
    keep_metrics_before,
    own_checkpoints_expected,
)
from bert_lightning.training.trainer import build_trainer

log = logging.getLogger(__name__)


def model_config(cfg: DictConfig, tok):
    return instantiate(
        cfg.model, "model", vocab_size=tok.get_vocab_size(), pad_token_id=special_ids(tok)["[PAD]"]
    )


def build(cfg: DictConfig, start: ResumePoint | None = None):
    """Data module, Lightning module and trainer of a run, before any training. `start`: the
    checkpoint a resumed run continues (its tokenizer and schedule)."""
    out_dir = Path(cfg.paths.output_dir)
    check_types(cfg.optim, "optim")  # built by the trainer, once the corpus is read
    dm = instantiate(cfg.data, "data")
    if start is not None:  # a refused resume writes nothing, not even the tokenizer
        saved = Tokenizer.from_str(start.tokenizer)
        check_same_model(start, cfg.ckpt_path, asdict(model_config(cfg, saved)))
    tok = dm.build_tokenizer(out_dir, start.tokenizer if start else None)
    config = model_config(cfg, tok)
    if config.max_position_embeddings < cfg.data.max_seq_length:
        raise UserError(
            f"data.max_seq_length={cfg.data.max_seq_length} exceeds "
            f"model.max_position_embeddings={config.max_position_embeddings}"
        )
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    module = BertPretrainModule(
        config=asdict(config),
        optim=continued_optim(optim, start, cfg.trainer.max_steps),
        tokenizer_json=tok.to_str(),
        compile=cfg.get("model_compile", False),
        objective=dm.objective,
    )
    return dm, module, build_trainer(cfg)


def end_of_budget(trainer) -> None:
    """A run on a time budget stops between checkpoints (Lightning validates at the stop, but a
    run that checkpoints every N steps saves only then): `last.ckpt` is written at the final
    step, so the run's weights are those of its whole budget."""
    ckpt = trainer.checkpoint_callback
    if budget_timer(trainer) is None or ckpt is None or not ckpt.save_last:
        return
    trainer.save_checkpoint(
        Path(ckpt.dirpath) / f"{ckpt.CHECKPOINT_NAME_LAST}{ckpt.FILE_EXTENSION}"
    )


def train(cfg: DictConfig) -> float | None:
    """Returns the last validation loss (what a sweep minimises); None when a resumed run had
    nothing left to do."""
    out_dir = Path(cfg.paths.output_dir)
    with failure_marked(out_dir, resuming=bool(cfg.ckpt_path)) as run:
        required(cfg)
        use = "ckpt_path (resuming a pretraining run)"
        start = resume_point(cfg.ckpt_path, PRETRAINING, use) if cfg.ckpt_path else None
        if already_done(cfg, start):
            return None
        L.seed_everything(cfg.seed, workers=True)
        dm, module, trainer = build(cfg, start)
        run.begun = True
        if rank_zero_only.rank == 0:  # before fit launches any other rank
            keep_metrics_before(out_dir / "metrics.csv", start.step if start else 0)
        if cfg.validate_before_fit and start is None:
            # the starting point of the loss curve; the progress bar prints its own line
            trainer.validate(module, datamodule=dm, verbose=not cfg.trainer.enable_progress_bar)
        with own_checkpoints_expected(cfg.ckpt_path):
            trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
            end_of_budget(trainer)
    val_loss = trainer.callback_metrics.get("val/loss")
    log.info("outputs in %s", out_dir)
    return float(val_loss) if val_loss is not None else None
