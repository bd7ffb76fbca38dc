"""`train(cfg)`: one pretraining run from a composed Hydra config (`train.py`,
`bert-lightning pretrain` and tests call it), through the run skeleton (training/run.py): what
pretraining builds (the corpus's data module, the model, the trainer) and what follows its fit
(the validation loss returned)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, fields, replace
from itertools import islice
from pathlib import Path

from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from bert_lightning.checkpoint import PRETRAINING, Checkpoint, ResumePoint, read_checkpoint
from bert_lightning.data.tokenizer import extend_wordpiece, load_tokenizer, special_ids
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import file_digest
from bert_lightning.model import BertConfig
from bert_lightning.training.instantiate import check_types, command_line, instantiate
from bert_lightning.training.resume import (
    FREE_ON_RESUME,
    TEACHER_DIGEST,
    check_same_data,
    check_same_model,
    check_same_objective,
    continued_optim,
)
from bert_lightning.training.run import RunKind, run
from bert_lightning.training.trainer import build_trainer
from bert_lightning.weights import (
    load_start,
    padded_vocab,
    with_layers,
    with_new_words,
    with_principal_embeddings,
)

log = logging.getLogger(__name__)


# the `data` settings a validation loss depends on: the data module that makes the examples,
# how files are read, how examples are framed (NSP: paired) and masked, how many are scored
VALIDATION_KEYS = (
    "_target_",
    *("text_unit", "max_doc_chars", "long_docs", "on_bad_record"),
    *("max_seq_length", "packing", "short_seq_prob", "dupe_factor", "objective"),
    *("batch_size", "seed", "masking", "max_eval_samples"),
)


def validation_settings(data: DictConfig) -> dict:
    """`data`'s VALIDATION_KEYS that it has: recorded in the checkpoint, so that `evaluate`
    frames any files as the run framed its validation files."""
    keys = [k for k in VALIDATION_KEYS if k in data]
    values = {k: data[k] for k in keys}  # read in place: `seed` is `${seed}` of the whole config
    return {
        k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in values.items()
    }


# what a start's shape fixes: BertConfig fields but those a run may set (dropout, the init of
# new heads) and those of the tokenizer
SHAPE = [
    f.name
    for f in fields(BertConfig)
    if f.name not in (*FREE_ON_RESUME, "vocab_size", "pad_token_id", "position_embedding_init")
]


def model_config(cfg: DictConfig, tok: Tokenizer, begin: Checkpoint | None = None) -> BertConfig:
    """`model=` for `tok`, or the shape of the weights a run starts from (`begin`) with the
    settings a run may change (dropout) from `model`, its vocabulary grown to `tok`'s (new
    words: `data.tokenizer.extend`)."""
    if begin is None:
        return instantiate(
            cfg.model,
            "model",
            vocab_size=tok.get_vocab_size(),
            pad_token_id=special_ids(tok)["[PAD]"],
        )
    config = replace(begin.config, **{k: cfg.model[k] for k in FREE_ON_RESUME if k in cfg.model})
    if tok.get_vocab_size() > config.vocab_size:
        config = replace(config, vocab_size=padded_vocab(tok.get_vocab_size()))
    return config


def id_parts(tok: Tokenizer) -> dict:
    """What makes a tokenizer's ids, by the name a message gives each part: its vocabulary,
    its model's other settings (the unknown token, the subword prefix), what text goes through
    before it (lowercasing, accents, splitting) and its special tokens; not the truncation or
    padding a caller sets, the decoder, nor the post-processor (the data add [CLS] and [SEP]
    themselves)."""
    spec = json.loads(tok.to_str())
    model = spec.pop("model")
    skip = ("truncation", "padding", "decoder", "post_processor", "version")
    return {
        "vocabularies": model.pop("vocab"),
        "model settings": model,
        **{f"{k}s": v for k, v in spec.items() if k not in skip},
    }


def same_tokenizer(a: Tokenizer, a_name: str, b: Tokenizer, b_name: str) -> None:
    """Two tokenizers a run reads as one (a student's and its teacher's): the same ids for any
    text, or an error naming the parts that differ."""
    ours, theirs = id_parts(a), id_parts(b)
    if differ := [k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)]:
        raise UserError(
            f"{a_name} and {b_name} have different {', '.join(sorted(differ))}; expected one "
            "tokenizer"
        )


def starting_point(cfg: DictConfig, teacher: Checkpoint | None) -> Checkpoint | None:
    """The weights a run starts from: `init_from=` (a Hugging Face BERT folder or a `.ckpt` of
    ours), or the teacher's `objective.student_layers` (distillation); None: random weights of
    `model=` (with `objective.embeddings_from_teacher`, `build` then sets its embeddings). Its
    shape is the model's: a `model=` on the command line that contradicts it is an error naming
    both."""
    layers = cfg.objective.get("student_layers")
    options = {
        "init_from=": cfg.init_from,
        "objective.student_layers": layers,
        "objective.embeddings_from_teacher": cfg.objective.get("embeddings_from_teacher"),
    }
    starts = [k for k, v in options.items() if v]
    if len(starts) > 1:
        raise UserError(f"{' and '.join(starts)} each start the student; give one")
    if cfg.init_from:
        begin, name = read_checkpoint(cfg.init_from), f"init_from={cfg.init_from}"
    elif layers:
        begin, name = with_layers(teacher, list(layers)), f"objective.student_layers={list(layers)}"
    else:
        return None
    if teacher is not None:
        same_tokenizer(
            begin.tokenizer, name, teacher.tokenizer, f"objective.teacher={cfg.objective.teacher}"
        )
    differ = [k for k in SHAPE if k in cfg.model and cfg.model[k] != getattr(begin.config, k)]
    given = command_line("model")
    ours = ", ".join(f"{k}={cfg.model[k]}" for k in differ)
    theirs = ", ".join(f"{k}={getattr(begin.config, k)}" for k in differ)
    if differ and given:
        raise UserError(
            f"{' '.join(given)} ({ours}) contradicts {name} ({theirs}); the start gives the "
            "model's shape: leave model= out"
        )
    if differ:
        log.info("the model has %s's shape: %s", name, theirs)
    return begin


def build(cfg: DictConfig, start: ResumePoint | None = None):
    """Data module, Lightning module and trainer of a run, before any training. `start`: the
    checkpoint a resumed run continues (its tokenizer and schedule; its data are checked). The
    weights, shape and tokenizer come from `init_from=` or a distillation's teacher when given
    (`starting_point`); a resumed run reads those again for its shape, and its weights from
    `start`."""
    out_dir = Path(cfg.paths.output_dir)
    check_types(cfg.optim, "optim")  # built by the trainer, once the corpus is read
    teacher = read_checkpoint(cfg.objective.teacher) if cfg.objective.get("teacher") else None
    begin = starting_point(cfg, teacher)
    given = begin or teacher  # the tokenizer a run starts with
    trained = command_line("data.tokenizer.vocab_size", "data.tokenizer.min_frequency")
    if given is not None and trained:
        raise UserError(
            f"{' '.join(trained)}: the run reads the tokenizer of {given.source} (init_from= or "
            "a teacher gives it; these settings shape a tokenizer trained on the corpus only); "
            "leave them out"
        )
    if given is not None and cfg.data.tokenizer.path:
        same_tokenizer(
            given.tokenizer,
            given.source,
            load_tokenizer(cfg.data.tokenizer.path),
            f"data.tokenizer.path={cfg.data.tokenizer.path}",
        )
    resumed = Tokenizer.from_str(start.tokenizer) if start is not None else None
    objective = OmegaConf.to_container(cfg.objective, resolve=True)
    digest = file_digest(cfg.objective.teacher) if teacher is not None else None
    if start is not None:  # a refused resume writes nothing, not even the tokenizer
        check_same_objective(start, cfg.ckpt_path, objective, digest)
        check_same_model(start, cfg.ckpt_path, asdict(model_config(cfg, resumed, begin)))
    tokenizer = resumed or (given.tokenizer if given is not None else None)
    data = lambda tok: instantiate(cfg.data, "data", out_dir=str(out_dir), given_tokenizer=tok)
    dm = data(tokenizer)
    if start is not None:  # the resumed run's tokenizer given: nothing written yet
        check_same_data(start, cfg.ckpt_path, dm.data_record(), cfg.resume_with_new_data)
    extend = OmegaConf.select(cfg, "data.tokenizer.extend", default=0)
    if extend and start is None:  # a resumed run has the words in its tokenizer
        if begin is None or teacher is not None:
            raise UserError(
                f"data.tokenizer.extend={extend} adds words to init_from='s tokenizer; give "
                "init_from= (a distilled student keeps its teacher's tokenizer)"
            )
        docs = islice(dm.tokenizer_documents(), cfg.data.tokenizer.max_docs)
        begin = with_new_words(begin, *extend_wordpiece(begin.tokenizer, docs, extend))
        dm = data(begin.tokenizer)
    tok = dm.build_tokenizer()
    config = model_config(cfg, tok, begin)
    for name, c in (("model", config), ("objective.teacher", teacher and teacher.config)):
        if c is not None and c.max_position_embeddings < cfg.data.max_seq_length:
            raise UserError(
                f"data.max_seq_length={cfg.data.max_seq_length} exceeds "
                f"{name}.max_position_embeddings={c.max_position_embeddings}"
            )
    optim = OmegaConf.to_container(cfg.optim, resolve=True)
    module = instantiate(cfg.objective, "objective")(
        config=asdict(config),
        optim=continued_optim(optim, start, cfg.trainer.max_steps),
        tokenizer_json=tok.to_str(),
        compile=cfg.model_compile,
        objective=dm.objective,
        data=validation_settings(cfg.data),
        **({"teacher_ckpt": teacher} if teacher is not None else {}),
    )
    module.data_record = dm.data_record()
    if teacher is not None:
        module.hparams[TEACHER_DIGEST] = digest
    if start is None and begin is not None:
        load_start(module.model, begin)
    elif start is None and cfg.objective.get("embeddings_from_teacher"):
        load_start(module.model, with_principal_embeddings(teacher, config))
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
