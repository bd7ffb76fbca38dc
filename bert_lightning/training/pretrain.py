"""`train(cfg)`: one pretraining run from a composed Hydra config (`train.py`,
`bert-lightning pretrain` and tests call it)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import lightning as L
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from bert_lightning.checkpoint import PRETRAINING, checkpoint_tokenizer
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.errors import UserError
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.trainer import build_trainer, save_resolved_config

log = logging.getLogger(__name__)


def build(cfg: DictConfig):
    """Data module, Lightning module and trainer of a run, before any training."""
    out_dir = Path(cfg.paths.output_dir)
    dm = instantiate(cfg.data)
    tokenizer_json = None
    if cfg.ckpt_path:
        use = "ckpt_path (resuming a pretraining run)"
        tokenizer_json = checkpoint_tokenizer(cfg.ckpt_path, PRETRAINING, use)
    tok = dm.build_tokenizer(out_dir / "checkpoints", tokenizer_json)
    config = instantiate(
        cfg.model, vocab_size=tok.get_vocab_size(), pad_token_id=special_ids(tok)["[PAD]"]
    )
    if config.max_position_embeddings < cfg.data.max_seq_length:
        raise UserError(
            f"data.max_seq_length={cfg.data.max_seq_length} exceeds "
            f"model.max_position_embeddings={config.max_position_embeddings}"
        )
    module = BertPretrainModule(
        config=asdict(config),
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        tokenizer_json=tok.to_str(),
        compile=cfg.get("model_compile", False),
        objective=dm.objective,
    )
    return dm, module, build_trainer(cfg)


def train(cfg: DictConfig) -> float | None:
    """Returns the last validation loss (what a sweep minimises)."""
    L.seed_everything(cfg.seed, workers=True)
    dm, module, trainer = build(cfg)
    save_resolved_config(cfg, Path(cfg.paths.output_dir))
    if cfg.validate_before_fit and not cfg.ckpt_path:
        trainer.validate(module, datamodule=dm)  # the starting point of the loss curve
    trainer.fit(module, datamodule=dm, ckpt_path=cfg.ckpt_path)
    val_loss = trainer.callback_metrics.get("val/loss")
    log.info("outputs in %s", cfg.paths.output_dir)
    return float(val_loss) if val_loss is not None else None
