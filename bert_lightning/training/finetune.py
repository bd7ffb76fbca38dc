"""`finetune(cfg)`: one fine-tuning run from a composed Hydra config (`finetune.py`,
`bert-lightning finetune` and tests call it), through the run skeleton (training/run.py): what
fine-tuning builds (the task's data, its model, the trainer) and what follows its fit (the best
checkpoint tested, `results.json`)."""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import asdict, replace
from functools import partial
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from bert_lightning.atomic import write_json
from bert_lightning.checkpoint import FINETUNING, ResumePoint, read_checkpoint
from bert_lightning.choices import FINETUNE
from bert_lightning.data.tokenizer import load_tokenizer, special_ids, train_wordpiece
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import file_digest
from bert_lightning.inference import table_scores, zero_shot_cosines
from bert_lightning.model.bert import BertConfig
from bert_lightning.progress import Waiting
from bert_lightning.run_folder import drop_phase_metrics
from bert_lightning.tasks.base import Task, load_splits, train_texts
from bert_lightning.tasks.datamodule import TaskDataModule
from bert_lightning.tasks.kinds import make_task
from bert_lightning.training.finetune_module import FinetuneModule
from bert_lightning.training.instantiate import check_types, command_line, instantiate
from bert_lightning.training.resume import check_same_data, check_same_model, continued_optim
from bert_lightning.training.run import Entry, run
from bert_lightning.training.trainer import build_trainer
from bert_lightning.weights import ENCODER, load_weights

log = logging.getLogger(__name__)

RESUME_USE = "ckpt_path (resuming a fine-tuning run; init_from= starts one)"


def task_tables(cfg: DictConfig) -> tuple[Task, dict]:
    """The task (completed by what the train file fixes) and its splits, the train split's
    targets softened by `soft_labels.encoder`'s zero-shot scores when one is given."""
    soft = cfg.soft_labels
    if not soft.encoder and soft.weight != FINETUNE.soft_labels.weight:
        raise UserError(
            f"soft_labels.weight={soft.weight}: weighs soft_labels.encoder's zero-shot scores, "
            "and no soft_labels.encoder is given; give one or leave the weight out"
        )
    task, tables = load_splits(make_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.seed)
    if soft.encoder:
        length = cfg.data.max_seq_length
        encoder = partial(zero_shot_cosines, soft.encoder, max_seq_length=length)
        tables["train"] = task.with_soft_labels(tables["train"], encoder, soft.weight)
    return task, tables


def encoder_and_tokenizer(cfg: DictConfig, train: dict):
    """(config, tokenizer, the checkpoint whose encoder starts the run or None, the start's
    record: path, digest, step, source; None for random weights): a resumed run's own (its
    record kept), `init_from`'s, else random weights of `model` with `data.tokenizer.path`
    (or a WordPiece trained on the `train` table)."""
    if cfg.ckpt_path:  # resuming: the run's own tokenizer and start
        pre = read_checkpoint(cfg.ckpt_path, FINETUNING, RESUME_USE)
        log.info("resuming from %s", pre.source)
        first = pre.hparams.get("start")
        if cfg.init_from:
            check_resumed_start(cfg.init_from, cfg.ckpt_path, first)
        return pre.config, pre.tokenizer, None, first
    tokenizer = cfg.data.tokenizer
    if cfg.init_from:
        if ignored := command_line("model", "data.tokenizer"):
            raise UserError(
                f"{' '.join(ignored)}: init_from={cfg.init_from} gives the encoder and its "
                "tokenizer (these shape a random start only); leave them out"
            )
        pre = read_checkpoint(cfg.init_from)
        log.info("fine-tuning from %s", pre.source)
        path = os.path.abspath(cfg.init_from)  # what `interpolate` moves back towards
        first = {"path": path, "digest": file_digest(path), "step": pre.step, "source": pre.source}
        return pre.config, pre.tokenizer, pre, first
    if tokenizer.path:
        if ignored := command_line("data.tokenizer.vocab_size"):
            raise UserError(
                f"{' '.join(ignored)}: data.tokenizer.path={tokenizer.path} is used as it is "
                "(the size of a tokenizer trained on the train file); leave it out"
            )
        tok = load_tokenizer(tokenizer.path)
    else:
        texts = train_texts(train)
        tok = train_wordpiece(lambda: iter(texts), tokenizer.vocab_size, max_docs=None)  # all
    config = instantiate(
        cfg.model, "model", vocab_size=tok.get_vocab_size(), pad_token_id=special_ids(tok)["[PAD]"]
    )
    log.warning("no `init_from` given: the encoder starts from RANDOM weights (no pretraining)")
    return config, tok, None, None


def check_resumed_start(init_from: str, ckpt_path: str, first: dict | None) -> None:
    """A resumed run goes on from its checkpoint and reads no `init_from`: one given again must
    be the start the checkpoint records (its path, or other bytes of the same), never another
    that the resume would ignore."""
    if first is None:
        raise UserError(
            f"init_from={init_from}: {ckpt_path} records no start (random weights, or fine-tuned "
            "before checkpoints kept one) to check it against; a resumed run goes on from its "
            "checkpoint: leave init_from out"
        )
    if os.path.abspath(init_from) == first["path"]:
        return
    if not os.path.exists(init_from):
        raise UserError(f"init_from={init_from}: no such file or folder")
    if file_digest(init_from) != first["digest"]:
        raise UserError(
            f"init_from={init_from}: {ckpt_path} started from {first['path']}; a resumed run "
            "goes on from its checkpoint (leave init_from out, or give the start it records)"
        )


def trained_config(cfg: DictConfig, config: BertConfig, task: Task, resume: ResumePoint | None):
    """The encoder's config as this run trains it (its dropout), checked against the lengths
    it reads and against the run it resumes (the same model, the same frozen encoder)."""
    if cfg.dropout is not None:  # a checkpoint pretrained without dropout fine-tunes with some
        p = cfg.dropout
        config = replace(config, hidden_dropout_prob=p, attention_probs_dropout_prob=p)
    if (length := cfg.data.max_seq_length) > config.max_position_embeddings:
        raise UserError(
            f"data.max_seq_length={length} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    check_same_model(resume, cfg.ckpt_path, asdict(config), asdict(task.cfg))
    frozen = bool(cfg.freeze_encoder)  # makes the optimizer's groups: the encoder's or none
    if resume is not None and (was := resume.hparams["freeze_encoder"]) != frozen:
        raise UserError(
            f"{cfg.ckpt_path}: trained with freeze_encoder={was}, this run has "
            f"freeze_encoder={frozen}; a resumed run keeps its frozen encoder (give "
            f"freeze_encoder={was})"
        )
    return config


def data_module(cfg: DictConfig, task: Task, tables: dict, tokenizer, resume: ResumePoint | None):
    """The task's data module and its data record (with the soft labels' encoder), checked
    against the run it resumes."""
    data = cfg.data
    dm = TaskDataModule(
        task=task,
        tables=tables,
        tokenizer=tokenizer,
        batch_size=data.batch_size,
        eval_batch_size=data.eval_batch_size,
        max_seq_length=data.max_seq_length,
        seed=cfg.seed,
    )
    encoder, weight = cfg.soft_labels.encoder, cfg.soft_labels.weight  # in the targets
    record = dm.data_record() | {"soft_labels.encoder": encoder and [encoder, file_digest(encoder)]}
    record |= {"soft_labels.weight": weight} if encoder else {}
    check_same_data(resume, cfg.ckpt_path, record, cfg.resume_with_new_data)
    return dm, record


def build(cfg: DictConfig, resume: ResumePoint | None = None):
    """The task's data module, the module (its head sized by what the train file fixed) and
    the trainer. `resume`: the checkpoint a resumed run continues (its model must be this one,
    its data the same unless `resume_with_new_data`)."""
    check_types(cfg.optim, "optim")  # before the data are read
    task, tables = task_tables(cfg)
    config, tokenizer, pre, first = encoder_and_tokenizer(cfg, tables["train"])
    config = trained_config(cfg, config, task, resume)
    dm, record = data_module(cfg, task, tables, tokenizer, resume)
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    module = FinetuneModule(
        asdict(config),
        task,
        continued_optim(optim, resume, cfg.trainer.max_steps),
        cfg.freeze_encoder,
        tokenizer.to_str(),
        max_seq_length=cfg.data.max_seq_length,
        data_record=record,
        start=first,
    )
    if pre is not None:  # the encoder's weights; the head keeps its initial ones
        load_weights(module.model, pre, ENCODER)
    return dm, module, build_trainer(cfg)


def after_fit(cfg: DictConfig, dm: TaskDataModule, module: FinetuneModule, trainer) -> dict:
    """Tests the best checkpoint by the task's main validation metric (the last weights when
    none was kept), adds the task's `test_report` on the same rows (baselines, ranking with
    intervals), if it has one, and writes `results.json`; returns what it wrote."""
    out_dir, task = Path(cfg.paths.output_dir), module.task
    ckpt = trainer.checkpoint_callback
    best = ckpt.best_model_path if ckpt is not None and ckpt.best_model_path else None
    kept = os.path.relpath(best, out_dir) if best else None  # moves with the run
    best_val = float(ckpt.best_model_score) if best and ckpt.best_model_score is not None else None
    if best_val is not None and not math.isfinite(best_val):  # Lightning keeps NaN as -inf/inf
        log.warning(
            "val/%s had no value at any validation (NaN): the checkpoint kept, %s, is not "
            "the best by it",
            task.cfg.monitor,
            kept,
        )
        best_val = math.nan
    if trainer.is_global_zero:  # a resumed run's test is redone whole (a stop in the baselines)
        drop_phase_metrics(out_dir, "test/")
    with Waiting(f"testing {kept or 'the last weights'} on {dm.rows['test']:,} test rows"):
        test = trainer.test(module, datamodule=dm, ckpt_path=best, verbose=False)[0]
    results = {
        "task": task.cfg.kind,
        "init_from": module.init_from,
        "freeze_encoder": bool(cfg.freeze_encoder),
        "rows": dm.rows,
        "best_checkpoint": kept,
        "best_val": {f"val/{task.cfg.monitor}": best_val} if best_val is not None else None,
        "steps": trainer.global_step,
        "test": {k: float(v) for k, v in test.items()},
    }
    zero_shot = (
        partial(zero_shot_cosines, cfg.init_from, max_seq_length=cfg.data.max_seq_length)
        if cfg.init_from
        else None
    )
    table = dm.tables["test"]  # the best weights, tested above, score its rows
    score = partial(
        table_scores, module.model.eval(), task, dm.tokenizer, table, cfg.data.max_seq_length
    )
    results |= task.test_report(table, score, zero_shot)
    if report := task.report_table(results):  # the console of a run, a cell's log in the suite
        log.info("test rows beside the task's baselines:\n%s", report)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(results, out_dir / "results.json")
    log.info("test metrics %s; outputs in %s", results["test"], out_dir)
    return results


def finished(cfg: DictConfig, step: int) -> bool:
    """Whether the run folder's `results.json` is that of the fit that ended at `step`: a run
    stopped in its test or baselines wrote none (or left an earlier part's)."""
    results = Path(cfg.paths.output_dir) / "results.json"
    return results.is_file() and json.loads(results.read_text()).get("steps") == step


FINETUNING_RUN = Entry(FINETUNING, RESUME_USE, build, after_fit, finished, ("finetune", "train"))


def finetune(cfg: DictConfig) -> dict | None:
    """What `results.json` holds; None when a resumed run had nothing to do."""
    return run(cfg, FINETUNING_RUN)


def best_val(results: dict | None, cfg: DictConfig) -> float | None:
    """What a sweep optimises: the best validation value of the task's main metric (None when
    a resumed run had nothing to do, or no validation ran)."""
    return ((results or {}).get("best_val") or {}).get(f"val/{cfg.task.monitor}")
