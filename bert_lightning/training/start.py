"""`run_start(cfg, resume, dm)`: what a pretraining run starts from, in one record (`Start`): the
model's shape, the tokenizer, the weights loaded before the first step, a distillation's
teacher, and where each came from. It is the one place that reads the start's files (the
teacher, `init_from=`) and that checks a resumed run against the run it continues, so that
`pretrain.build` only builds from it."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import asdict, dataclass, fields, replace
from itertools import islice

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from tokenizers import Tokenizer

from bert_lightning.checkpoint import Checkpoint, ResumePoint, read_checkpoint
from bert_lightning.data.tokenizer import extend_wordpiece, load_tokenizer, special_ids
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import file_digest
from bert_lightning.model import BertConfig, encoder_parameter_formula
from bert_lightning.shipped import group_defaults
from bert_lightning.training.instantiate import command_line, instantiate
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.resume import (
    FREE_ON_RESUME,
    check_same_data,
    check_same_model,
    check_same_objective,
)
from bert_lightning.weights import (
    padded_vocab,
    with_layers,
    with_new_words,
    with_principal_embeddings,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Start:
    """What a run starts from, read before any module is built. `weights`: loaded before the
    first step (None: `model=`'s random ones, or a resumed run's, which the trainer loads from
    `ckpt_path=`); `teacher`: a distillation's, read once and handed to its module, with the
    digest of its file (`teacher_digest`: a resumed run checks it). `*_from`: where each came
    from, the run's log line (`str`)."""

    config: BertConfig
    tokenizer: Tokenizer
    weights: Checkpoint | None
    teacher: Checkpoint | None
    teacher_digest: str | None
    weights_from: str
    tokenizer_from: str
    shape_from: str

    def __str__(self) -> str:
        return (
            f"weights: {self.weights_from}; tokenizer: {self.tokenizer_from}; "
            f"shape: {self.shape_from}"
        )


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
    `model=` (with `objective.embeddings_from_teacher`, `run_start` then sets its embeddings).
    Its shape is the model's: a `model=` on the command line that contradicts it is an error
    naming both."""
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


def check_given_tokenizer(cfg: DictConfig, given: Checkpoint | None) -> None:
    """A run whose tokenizer `init_from=` or a teacher gives (`given`) trains none, and a
    `data.tokenizer.path` beside it must be that tokenizer."""
    if given is None:
        return
    keys = ("vocab_size", "min_frequency")
    trained = command_line(*(f"data.tokenizer.{k}" for k in keys))
    why = (
        f"the run reads the tokenizer of {given.source} (init_from= or a teacher gives it; "
        "these settings shape a tokenizer trained on the corpus only)"
    )
    if trained:
        raise UserError(f"{' '.join(trained)}: {why}; leave them out")
    shipped = group_defaults("data", "_corpus")["tokenizer"]
    if unused := [f"data.tokenizer.{k}={cfg.data.tokenizer[k]}" for k in keys
                  if k in cfg.data.tokenizer and cfg.data.tokenizer[k] != shipped[k]]:  # fmt: skip
        log.warning(
            "%s (set by the config, not the command line): unused; %s", " ".join(unused), why
        )
    if cfg.data.tokenizer.path:
        same_tokenizer(
            given.tokenizer,
            given.source,
            load_tokenizer(cfg.data.tokenizer.path),
            f"data.tokenizer.path={cfg.data.tokenizer.path}",
        )


def with_corpus_words(
    cfg: DictConfig, dm: L.LightningDataModule, begin: Checkpoint | None, teacher: Checkpoint | None
) -> Checkpoint:
    """`begin` with `data.tokenizer.extend` new words, the corpus's most frequent ones that its
    tokenizer cuts into pieces (`extend_wordpiece`); only `init_from=` has a tokenizer to
    extend."""
    extend = cfg.data.tokenizer.extend
    if begin is None or teacher is not None:
        raise UserError(
            f"data.tokenizer.extend={extend} adds words to init_from='s tokenizer; give "
            "init_from= (a distilled student keeps its teacher's tokenizer)"
        )
    docs = islice(dm.tokenizer_documents(), cfg.data.tokenizer.max_docs)
    return with_new_words(begin, *extend_wordpiece(begin.tokenizer, docs, extend))


def check_positions(max_seq_length: int, config: BertConfig, teacher: Checkpoint | None) -> None:
    """Both models read a whole example: `data.max_seq_length` positions."""
    for name, c in (("model", config), ("objective.teacher", teacher and teacher.config)):
        if c is not None and c.max_position_embeddings < max_seq_length:
            raise UserError(
                f"data.max_seq_length={max_seq_length} exceeds "
                f"{name}.max_position_embeddings={c.max_position_embeddings}"
            )


START_SCHEDULE = "${start_schedule:"  # conf/optim/pretrain.yaml's resolver (config.py)


def say_schedule(cfg: DictConfig) -> None:
    """One line naming, of continued.yaml's own values (those that differ from adamw.yaml's),
    those an `init_from=` run takes as its start calls for (conf/optim/pretrain.yaml's
    `${start_schedule:...}`) and those the config sets otherwise."""
    scratch = group_defaults("optim", "adamw")
    own = [k for k, v in group_defaults("optim", "continued").items() if v != scratch[k]]
    taken = [k for k in own if START_SCHEDULE in str(OmegaConf.to_container(cfg.optim)[k])]
    shown = lambda keys: ", ".join(f"{k}={cfg.optim[k]}" for k in keys) or "none"
    log.info(
        "init_from=%s: continued pretraining at conf/optim/continued.yaml's %s in place of "
        "adamw.yaml's from-scratch values; as the config sets them: %s",
        *(cfg.init_from, shown(taken), shown(k for k in own if k not in taken)),
    )


def check_mlm_head(cfg: DictConfig, begin: Checkpoint, vocab_size: int) -> None:
    """An MLM run from weights without an MLM head (an encoder alone: a sentence-transformers
    folder, a fine-tuned checkpoint) trains a random head on trained features: its loss starts
    near that of a uniform guess, or above, not where the encoder's quality would put it. One
    line says so, so that a first loss above ln(vocabulary) reads as expected."""
    mlm = issubclass(get_object(cfg.objective._target_), BertPretrainModule)
    if mlm and not begin.has_mlm_head:
        log.info(
            "init_from=%s: no MLM head; the head starts random, so the loss starts near "
            "ln(%d) = %.2f or above",
            *(cfg.init_from, vocab_size, math.log(vocab_size)),
        )


def origins(
    cfg: DictConfig,
    resume: ResumePoint | None,
    begin: Checkpoint | None,
    given: Checkpoint | None,
    weights: Checkpoint | None,
    config: BertConfig,
) -> dict[str, str]:
    """Where a start's weights, tokenizer and shape came from (`Start`'s `*_from`); the shape
    names its size, whatever the overrides of its preset."""
    path = OmegaConf.select(cfg, "data.tokenizer.path")
    made = (
        f"data.tokenizer.path={path}" if path else "made from the training files (data.tokenizer)"
    )
    resumed = f"ckpt_path={cfg.ckpt_path} (resumed)" if resume is not None else None
    preset = HydraConfig.get().runtime.choices.get("model") if HydraConfig.initialized() else None
    c = config
    size = (
        f"{c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads, "
        f"{encoder_parameter_formula(c) / 1e6:.3g}M encoder parameters"  # 0.0539M, 1.55M, 110M
    )
    shape = begin.source if begin else (f"model={preset}" if preset else "the model config")
    return dict(
        weights_from=resumed or (weights.source if weights else "random"),
        tokenizer_from=resumed or (given.source if given else made),
        shape_from=f"{shape} ({size})",
    )


def run_start(cfg: DictConfig, resume: ResumePoint | None, dm: L.LightningDataModule) -> Start:
    """The start of a run: its data module's first step (`build_tokenizer`, which trains one
    when nothing gives it) taken with the tokenizer the start gives. The weights, shape and
    tokenizer come from `init_from=` or a distillation's teacher when given (`starting_point`),
    with `data.tokenizer.extend` words from the corpus (`with_corpus_words`); a resumed run
    (`resume`) keeps the tokenizer it trained with, reads `init_from=` again for its shape, and
    is checked against the run it continues before anything is written."""
    teacher = read_checkpoint(cfg.objective.teacher) if cfg.objective.get("teacher") else None
    begin = starting_point(cfg, teacher)
    given = begin or teacher  # the tokenizer a run starts with
    check_given_tokenizer(cfg, given)
    digest = file_digest(cfg.objective.teacher) if teacher is not None else None
    resumed = Tokenizer.from_str(resume.tokenizer) if resume is not None else None
    if resume is not None:  # a refused resume writes nothing, not even the tokenizer
        objective = OmegaConf.to_container(cfg.objective, resolve=True)
        check_same_objective(resume, cfg.ckpt_path, objective, digest)
        check_same_model(resume, cfg.ckpt_path, asdict(model_config(cfg, resumed, begin)))
        check_same_data(resume, cfg.ckpt_path, dm.data_record(resumed), cfg.resume_with_new_data)
    # a resumed run has the new words in its tokenizer
    if OmegaConf.select(cfg, "data.tokenizer.extend", default=0) and resume is None:
        given = begin = with_corpus_words(cfg, dm, begin, teacher)
    tok = dm.build_tokenizer(resumed or (given.tokenizer if given is not None else None))
    config = model_config(cfg, tok, begin)
    check_positions(cfg.data.max_seq_length, config, teacher)
    weights = None if resume is not None else begin
    if resume is None and cfg.objective.get("embeddings_from_teacher"):  # begin is None
        weights = with_principal_embeddings(teacher, config)
    if cfg.init_from and resume is None:  # a resumed run has its checkpoint's schedule
        say_schedule(cfg)
        check_mlm_head(cfg, begin, config.vocab_size)
    where = origins(cfg, resume, begin, given, weights, config)
    return Start(config, tok, weights, teacher, digest, **where)
