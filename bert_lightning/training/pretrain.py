"""`train(cfg)`: one pretraining run from a composed Hydra config (`train.py`,
`bert-lightning pretrain` and tests call it), through the run skeleton (training/run.py): what
pretraining builds (the corpus's data module, the model, the trainer) and what follows its fit
(the validation loss returned)."""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from bert_lightning.checkpoint import PRETRAINING, ResumePoint
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.errors import UserError
from bert_lightning.training.instantiate import check_types, instantiate
from bert_lightning.training.resume import (
    check_same_model,
    check_same_objective,
    continued_optim,
)
from bert_lightning.training.run import RunKind, run
from bert_lightning.training.trainer import build_trainer

log = logging.getLogger(__name__)


def validation_settings(data: DictConfig) -> dict:
    """The `data` settings a validation loss depends on (length, framing, batch size, seed,
    masking, and how long documents are read): recorded in the checkpoint for `evaluate`."""
    framing = ("max_seq_length", "packing", "batch_size", "seed", "masking")
    keys = [k for k in (*framing, "max_doc_chars", "long_docs") if k in data]
    values = {k: data[k] for k in keys}  # read in place: `seed` is `${seed}` of the whole config
    return {
        k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in values.items()
    }


def model_config(cfg: DictConfig, tok):
    return instantiate(
        cfg.model, "model", vocab_size=tok.get_vocab_size(), pad_token_id=special_ids(tok)["[PAD]"]
    )


def build(cfg: DictConfig, start: ResumePoint | None = None):
    """Data module, Lightning module and trainer of a run, before any training. `start`: the
    checkpoint a resumed run continues (its tokenizer and schedule)."""
    out_dir = Path(cfg.paths.output_dir)
    check_types(cfg.optim, "optim")  # built by the trainer, once the corpus is read
    resumed = Tokenizer.from_str(start.tokenizer) if start is not None else None
    if start is not None:  # a refused resume writes nothing, not even the tokenizer
        check_same_model(start, cfg.ckpt_path, asdict(model_config(cfg, resumed)))
        check_same_objective(start, cfg.ckpt_path, cfg.objective.get("generator_hidden_size"))
    dm = instantiate(cfg.data, "data", out_dir=str(out_dir), given_tokenizer=resumed)
    tok = dm.tokenizer
    config = model_config(cfg, tok)
    if config.max_position_embeddings < cfg.data.max_seq_length:
        raise UserError(
            f"data.max_seq_length={cfg.data.max_seq_length} exceeds "
            f"model.max_position_embeddings={config.max_position_embeddings}"
        )
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    module = instantiate(cfg.objective, "objective")(
        config=asdict(config),
        optim=continued_optim(optim, start, cfg.trainer.max_steps),
        tokenizer_json=tok.to_str(),
        compile=cfg.get("model_compile", False),
        objective=dm.objective,
        data=validation_settings(cfg.data),
    )
    return dm, module, build_trainer(cfg)


def after_fit(cfg: DictConfig, dm, module, trainer) -> float | None:
    """The last validation loss: what a sweep minimises."""
    val_loss = trainer.callback_metrics.get("val/loss")
    log.info("outputs in %s", Path(cfg.paths.output_dir))
    return float(val_loss) if val_loss is not None else None


PRETRAINING_RUN = RunKind(
    PRETRAINING,
    "ckpt_path (resuming a pretraining run)",
    build,
    after_fit,
    ("task", "finetune.py"),
)


def train(cfg: DictConfig) -> float | None:
    """The last validation loss; None when a resumed run had nothing left to do."""
    return run(cfg, PRETRAINING_RUN)
