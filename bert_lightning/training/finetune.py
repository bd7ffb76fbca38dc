"""`finetune(cfg)`: one fine-tuning run from a composed Hydra config (`finetune.py`,
`bert-lightning finetune` and tests call it)."""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

import lightning as L
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from bert_lightning.atomic import write_json
from bert_lightning.checkpoint import (
    FINETUNING,
    ResumePoint,
    load_encoder,
    read_checkpoint,
    resume_point,
)
from bert_lightning.data.sampling import ResumableShuffle
from bert_lightning.data.tables import GroupBatchSampler, collate
from bert_lightning.data.tokenizer import load_tokenizer, special_ids, train_wordpiece
from bert_lightning.errors import UserError
from bert_lightning.fields import check_types, instantiate, required
from bert_lightning.tasks.kinds import load_splits, make_task
from bert_lightning.training.baselines import ad_relevance_baselines, summary
from bert_lightning.training.finetune_module import FinetuneModule
from bert_lightning.training.resume import (
    RunState,
    already_done,
    check_same_model,
    continued_optim,
    failure_marked,
    keep_metrics_before,
    own_checkpoints_expected,
)
from bert_lightning.training.trainer import build_trainer

log = logging.getLogger(__name__)


def texts_of(table: dict) -> list[str]:
    if "words" in table:
        return [" ".join(w) for w in table["words"]]
    return table["text"] + (table["pair"] or [])


def encoder_and_tokenizer(cfg: DictConfig, train_table: dict):
    """(config, tokenizer, pretrained or None): from `pretrained`, else random weights of
    `model` with `tokenizer` (or a WordPiece trained on the train file)."""
    if cfg.ckpt_path:  # resuming: the run's own tokenizer, whatever `pretrained` says
        use = "ckpt_path (resuming a fine-tuning run; pretrained= starts one)"
        pre = read_checkpoint(cfg.ckpt_path, FINETUNING, use)
        log.info("resuming from %s", pre.source)
        return pre.config, pre.tokenizer, None
    if cfg.pretrained:
        pre = read_checkpoint(cfg.pretrained)
        log.info("fine-tuning from %s", pre.source)
        return pre.config, pre.tokenizer, pre
    if cfg.tokenizer:
        tok = load_tokenizer(cfg.tokenizer)
    else:
        texts = texts_of(train_table)
        tok = train_wordpiece(lambda: iter(texts), cfg.tokenizer_vocab_size)
    config = instantiate(
        cfg.model, "model", vocab_size=tok.get_vocab_size(), pad_token_id=special_ids(tok)["[PAD]"]
    )
    log.warning("no `pretrained` given: the encoder starts from RANDOM weights (no pretraining)")
    return config, tok, None


def best_val(results: dict | None, cfg: DictConfig) -> float | None:
    """What a sweep optimises: the best validation value of the task's main metric (None when
    a resumed run had nothing to do, or no validation ran)."""
    return ((results or {}).get("best_val") or {}).get(f"val/{cfg.task.monitor}")


def finetune(cfg: DictConfig) -> dict | None:
    """Fits, restores the best checkpoint by the task's main validation metric, tests it and
    writes `results.json`; returns what it wrote (None: a resumed run had nothing to do)."""
    out_dir = Path(cfg.paths.output_dir)
    with failure_marked(out_dir, resuming=bool(cfg.ckpt_path)) as run:
        required(cfg)
        use = "ckpt_path (resuming a fine-tuning run; pretrained= starts one)"
        start = resume_point(cfg.ckpt_path, FINETUNING, use) if cfg.ckpt_path else None
        if already_done(cfg, start):
            return None
        return _finetune(cfg, out_dir, start, run)


def _finetune(cfg: DictConfig, out_dir: Path, start: ResumePoint | None, run: RunState) -> dict:
    L.seed_everything(cfg.seed, workers=True)
    check_types(cfg.optim, "optim")  # before the data are read
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    tables = load_splits(task, cfg.seed)
    config, tok, pre = encoder_and_tokenizer(cfg, tables["train"])
    if cfg.dropout is not None:  # a checkpoint pretrained without dropout fine-tunes with some
        p = cfg.dropout
        config = replace(config, hidden_dropout_prob=p, attention_probs_dropout_prob=p)
    if cfg.max_seq_length > config.max_position_embeddings:
        raise UserError(
            f"max_seq_length={cfg.max_seq_length} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    check_same_model(start, cfg.ckpt_path, asdict(config), task.cfg)
    module = FinetuneModule(
        asdict(config),
        task.cfg,
        continued_optim(
            OmegaConf.to_container(cfg.optim, resolve=True), start, cfg.trainer.max_steps
        ),
        cfg.freeze_encoder,
        tok.to_str(),
        max_seq_length=cfg.max_seq_length,
    )
    if pre is not None:
        load_encoder(module.model, pre)

    pad = partial(collate, pad_id=special_ids(tok)["[PAD]"])
    feats = {k: task.encode(t, tok, cfg.max_seq_length) for k, t in tables.items()}
    if task.grouped_batches:
        sampler = GroupBatchSampler([f["group"] for f in feats["train"]], cfg.batch_size, cfg.seed)
        train_dl = StatefulDataLoader(feats["train"], batch_sampler=sampler, collate_fn=pad)
    else:  # stateful: a resumed run continues at the same batch of the same shuffled epoch
        shuffle = ResumableShuffle(feats["train"])  # a shuffled DataLoader's order
        train_dl = StatefulDataLoader(
            feats["train"], cfg.batch_size, sampler=shuffle, collate_fn=pad
        )
    eval_dl = {
        k: DataLoader(feats[k], cfg.eval_batch_size, collate_fn=pad) for k in ("validation", "test")
    }
    log.info("rows: %s", {k: len(v) for k, v in feats.items()})

    trainer = build_trainer(cfg)
    run.begun = True
    if rank_zero_only.rank == 0:
        keep_metrics_before(out_dir / "metrics.csv", start.step if start else 0)
    with own_checkpoints_expected(cfg.ckpt_path):
        trainer.fit(module, train_dl, eval_dl["validation"], ckpt_path=cfg.ckpt_path)
    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    test = trainer.test(module, eval_dl["test"], ckpt_path=best, verbose=False)[0]
    results = {
        "task": task.cfg["kind"],
        "pretrained": pre.source if pre else None,
        "freeze_encoder": bool(cfg.freeze_encoder),
        "rows": {k: len(v) for k, v in feats.items()},
        "best_checkpoint": best,
        "best_val": {f"val/{task.cfg['monitor']}": float(ckpt.best_model_score)}
        if best and ckpt.best_model_score is not None
        else None,
        "steps": trainer.global_step,
        "test": {k: float(v) for k, v in test.items()},
    }
    if task.cfg["kind"] == "ad_relevance" and task.cfg.get("baselines", True):
        results["baselines"] = ad_relevance_baselines(
            task, tables["test"], cfg.pretrained, cfg.max_seq_length
        )
        print(summary(results), flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(results, out_dir / "results.json")
    log.info("test metrics %s; outputs in %s", results["test"], out_dir)
    return results
