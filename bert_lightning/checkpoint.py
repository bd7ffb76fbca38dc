"""Checkpoint files and folders, read and written: a `.ckpt` of ours (pretraining or
fine-tuning) or a Hugging Face BERT folder, both brought into our key space (`bert.*`, `cls.*`,
`classifier.*`) as one `Checkpoint`, and a model written as a `.ckpt`. The one place that
unpickles a checkpoint (`torch.load(weights_only=True)`: tensors and plain values, never
objects), and whose records (hyper-parameters, data record) pass one schema before anything
reads them (`check_record`): a checkpoint someone else made is data, and no name in it is
imported or built. Training reads a resumed run's tokenizer here, commands read models here.
What is wrong with a checkpoint (not one, of the wrong origin, a tokenizer with ids the model
has no embedding for) is found here, once, as a `UserError` naming the file. What a run does to
the weights read here (layers, interpolation, new words) and their load into a model are
weights.py's."""

from __future__ import annotations

import math
import os
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer, normalizers

from bert_lightning.atomic import atomic_path
from bert_lightning.data.tokenizer import load_tokenizer, tokenizer_from_json
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.fields import check_values, json_file
from bert_lightning.interop import (
    DECODER,
    SCORE_HEAD,
    ST_POOLINGS,
    WORD_EMBEDDINGS,
    bert_config,
    config_from_hf,
    declared_by,
    has_mlm_head,
    hf_to_ours,
    join_qkv,
)
from bert_lightning.model import BertConfig, BertForPreTraining

PRETRAINING, FINETUNING, HUGGING_FACE = "pretraining", "fine-tuning", "Hugging Face"
RTD_KEY = "generator_hidden_size"  # in the hyper-parameters of an RTD pretraining checkpoint
DATA_RECORD = "data_record"  # the checkpoint key of what the run trained on (module_base.py)


OBJECTIVES = ("mlm", "rtd", "distill")  # conf/objective/'s, each its module's `OBJECTIVE`


def objective_of(hparams) -> str | None:
    """What pretrained a module of these hyper-parameters (or what an `objective` config
    trains): the name its pretraining module records (`objective`); None for another module
    (fine-tuning's) or a Hugging Face folder."""
    return hparams.get("objective")


@dataclass
class Checkpoint:
    config: BertConfig
    state_dict: dict[str, torch.Tensor]  # our key space, no Lightning `model.` prefix
    tokenizer: Tokenizer
    hparams: dict = field(default_factory=dict)  # the .ckpt's hyper_parameters ({} for HF)
    source: str = ""
    step: int = 0  # a .ckpt's global_step
    data_record: dict | None = None  # a .ckpt's (the data module's `data_record()`)

    @property
    def rtd(self) -> bool:
        """Pretrained by replaced-token detection (`objective=rtd`): `state_dict` holds its
        discriminator, the encoder; the generator stays in the `.ckpt`."""
        return objective_of(self.hparams) == "rtd"

    @property
    def has_mlm_head(self) -> bool:
        return has_mlm_head(self.state_dict)

    @property
    def origin(self) -> str:
        """What wrote it: PRETRAINING, FINETUNING (runs of ours) or HUGGING_FACE."""
        if not self.hparams:
            return HUGGING_FACE
        return FINETUNING if self.hparams.get("task") else PRETRAINING


NUMBER, NONE = (int, float), type(None)
# the hyper-parameters a module of ours records (training/*_module.py; a test builds each
# module and compares), with the types of their values: any other key is refused
RECORD_TYPES = {
    **dict.fromkeys(("config", "optim", "task", "start"), (dict,)),
    **dict.fromkeys(("nsp", "freeze_encoder", "embeddings_from_teacher"), (bool,)),
    "compile": (bool, str),
    "max_seq_length": (int, NONE),
    **dict.fromkeys(("generator_hidden_size", "disc_weight", "temperature"), NUMBER),
    **dict.fromkeys(("attention", "value_relation", "hidden", "embedding"), NUMBER),
    **dict.fromkeys(("soft_mlm", "mlm"), NUMBER),
    "teacher": (str,),
    "objective": (str,),
    "teacher_digest": (str, NONE),
    "relation_heads": (int, NONE),
    "student_layers": (list, NONE),
}
START_TYPES = {"path": str, "digest": str, "step": int | None, "source": str}  # a fine-tuning's
# the config sections recorded as composed, which keep Hydra's keys at their top: their values
# are compared with the run's own config, never instantiated (`resume.continued_optim`)
HYDRA_KEYS = {"optim": {"_target_": str, "_partial_": bool}}
PLAIN = (str, int, float, bool, NONE, list, tuple, dict)  # what a record's values may be


def check_plain(value, where: str, path, hydra: dict | None = None) -> None:
    """`value` (at `where` in the file at `path`) is plain data at any depth: no key that
    begins with `_` (Hydra's `_target_`, `_args_`, `_partial_`: a record is never a recipe for
    objects), but those of `hydra` of their type, no key but a string, no value but PLAIN."""
    if not isinstance(value, PLAIN):
        raise UserError(f"{path}: {where} holds a {type(value).__name__}; expected plain data")
    if isinstance(value, list | tuple):
        for i, v in enumerate(value):
            check_plain(v, f"{where}[{i}]", path)
    elif isinstance(value, dict):
        for k, v in value.items():
            key = f"{where}.{k}"
            if not isinstance(k, str):
                raise UserError(f"{path}: {where} has the key {k!r}; expected names")
            if k.startswith("_") and not isinstance(v, (hydra or {}).get(k, ())):
                raise UserError(
                    f"{path}: {key}: a key bert_lightning does not write (a checkpoint's "
                    "record is data: nothing in it names code to run)"
                )
            check_plain(v, key, path)


def check_record(raw: dict, path) -> None:
    """What a `.ckpt` records beside its weights, before anything reads it: the
    hyper-parameters (`RECORD_TYPES`' keys, plain values) and the data record (plain values)."""
    hparams = raw.get("hyper_parameters") or {}
    if not isinstance(hparams, dict):
        raise UserError(f"{path}: hyper_parameters is a {type(hparams).__name__}; expected a dict")
    for key, value in hparams.items():
        if key not in RECORD_TYPES:
            raise UserError(
                f"{path}: hyper_parameters.{key}: a key bert_lightning does not write; known: "
                f"{', '.join(sorted(RECORD_TYPES))}"
            )
        types = RECORD_TYPES[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = " or ".join("null" if t is NONE else t.__name__ for t in types)
            raise UserError(f"{path}: hyper_parameters.{key}: expected {expected}, got {value!r}")
        check_plain(value, f"hyper_parameters.{key}", path, HYDRA_KEYS.get(key))
    if (start := hparams.get("start")) is not None:  # what interpolate and a resume read
        if missing := [k for k in ("path", "digest") if k not in start]:
            raise UserError(f"{path}: hyper_parameters.start has no {missing[0]}")
        check_values(start, START_TYPES, f"{path}: hyper_parameters.start")
    if "objective" in hparams and hparams["objective"] not in OBJECTIVES:
        raise UserError(
            f"{path}: hyper_parameters.objective={hparams['objective']!r}; expected one of "
            f"{', '.join(OBJECTIVES)}"
        )
    check_plain(raw.get(DATA_RECORD), DATA_RECORD, path)
    for key, state in (raw.get("callbacks") or {}).items():
        if str(key).startswith("ModelCheckpoint"):
            check_checkpoint_paths(state, f"callbacks.{key}", path)
        elif str(key).startswith("ValidationBudget"):
            for name in ("cost", "spent", "reserved"):  # seconds; a cost of null: none yet
                v = (state or {}).get(name, 0.0)
                number = isinstance(v, int | float) and not isinstance(v, bool)
                if not (v is None and name == "cost") and not (
                    number and math.isfinite(v) and v >= 0
                ):
                    raise UserError(
                        f"{path}: callbacks.{key}.{name}={v!r}; expected a finite number >= 0"
                    )
        elif str(key).startswith(("EarlyStopping", "Timer")):
            check_counts(state, f"callbacks.{key}", path)
        elif (
            str(key).startswith("SaveOnInterrupt")
            and type((state or {}).get("save_waits")) is not bool
        ):
            raise UserError(f"{path}: callbacks.{key}: expected save_waits true or false")


def check_counts(state, where: str, path) -> None:
    """A resumed EarlyStopping's or Timer's state: the counts it restores, each a finite
    number >= 0 (a negative or unbounded training time is a run that never ends, or ends at
    once; a wait beyond any patience one that stops at its first validation), the Timer's
    other stages' times finite (it restores training's alone; a stop inside a validation
    records that stage's as begun after it ended: negative); EarlyStopping's best score one
    number (inf before its first validation)."""
    if not isinstance(state, dict) or not isinstance(state.get("time_elapsed", {}), dict):
        raise UserError(f"{path}: {where}: expected the callback's state")
    counts = {k: state[k] for k in ("wait_count", "stopped_epoch", "patience") if k in state}
    times = {f"time_elapsed.{k}": v for k, v in state.get("time_elapsed", {}).items()}
    for key, v in (counts | times).items():
        number = isinstance(v, int | float) and not isinstance(v, bool)
        signed = key.startswith("time_elapsed.") and key != "time_elapsed.train"
        if not number or not math.isfinite(v) or (v < 0 and not signed):
            at_least = "" if signed else " >= 0"
            raise UserError(f"{path}: {where}.{key}={v!r}; expected a finite number{at_least}")
    best = state.get("best_score")
    one = isinstance(best, torch.Tensor) and best.numel() == 1 and best.is_floating_point()
    if best is not None and (not (one or isinstance(best, float)) or math.isnan(float(best))):
        raise UserError(f"{path}: {where}.best_score={best!r}; expected one number")


CHECKPOINT_PATHS = ("best_model_path", "kth_best_model_path", "last_model_path")


def check_checkpoint_paths(state: dict, where: str, path) -> None:
    """The checkpoint callback's files, which a resume in the same folder may delete (a best
    checkpoint overtaken, the last one replaced): each a file of the folder its state names,
    written as `<folder>/<name>` (no `..`, which a moved run's rebased path would keep), or
    none."""
    if not isinstance(state, dict) or not isinstance(state.get("dirpath"), str | None):
        raise UserError(f"{path}: {where}: expected the checkpoint callback's state")
    folder = os.path.normpath(state.get("dirpath") or "")
    files = [state.get(k) for k in CHECKPOINT_PATHS] + list(state.get("best_k_models") or {})
    for file in files:
        name = os.path.basename(file) if isinstance(file, str) else ""
        if file and (name in ("", ".", "..") or file != os.path.join(folder, name)):
            raise UserError(
                f"{path}: {where} names {file!r}, not a file of its folder {folder}: a resume "
                "would write or delete it"
            )


class UnreadableCheckpoint(UserError):
    """A file torch.load cannot read: a text file, a copy cut short, a pickle of other objects."""


def torch_load(path: str | Path, mmap: bool = True) -> dict:
    """Weights-only (never runs pickled code), memory-mapped: a big checkpoint is not read
    whole to look at its tokenizer (old HF `.bin` files predate the format mmap needs)."""
    zipped = zipfile.is_zipfile(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipped)
    except Exception as e:
        why = str(e).strip().split("\n")[0] if zipped else "not the zip archive torch.save writes"
        raise UnreadableCheckpoint(
            f"{path}: not a checkpoint (torch.load could not read it: {why})"
        ) from e


def newest_intact(path: Path) -> tuple[Path, int] | None:
    """The checkpoint beside `path` that reads and holds the most steps (with its step), if
    any: where a run whose `last.ckpt` is cut short can continue. Temporary files (a `.`
    name: a write that never finished) are not candidates."""
    found = []
    for other in path.parent.glob("*.ckpt"):
        if other.name.startswith(".") or other.resolve() == path.resolve():
            continue
        try:
            raw = torch_load(other)
        except UserError:
            continue
        if isinstance(raw, dict) and raw.get("state_dict"):
            found.append((int(raw.get("global_step", 0)), other.stat().st_mtime, other))
    if not found:
        return None
    step, _, best = max(found)
    return best, step


def check_vocab(path, vocab_size: int, tokenizer: Tokenizer) -> None:
    """A tokenizer with more tokens than the model has embeddings gives ids out of range (an
    IndexError, or Lightning's size mismatch, far from the cause). More embeddings than tokens
    is fine: some models pad their vocabulary."""
    n = tokenizer.get_vocab_size()
    if n > vocab_size:
        raise UserError(
            f"{path}: the model has a vocabulary of {vocab_size} but its tokenizer has {n} tokens"
        )


def check_origin(path, ckpt: Checkpoint, origin: str | None, use: str) -> None:
    """`origin`: the origin `use` (what reads it, for the message) needs; None takes any."""
    if origin is not None and ckpt.origin != origin:
        raise UserError(f"{path}: a {ckpt.origin} checkpoint; {use} needs a {origin} one")


@dataclass
class ResumePoint:
    """Where a `.ckpt` left its run: what `ckpt_path=` continues from."""

    step: int  # optimizer steps done (Lightning's global_step)
    hparams: dict  # the module's hyper_parameters (`optim` holds the schedule's total_steps)
    tokenizer: str  # the tokenizer the run was trained with (a resumed run must keep it)
    data: dict | None  # its data record (training/resume.py); None: written before the record
    path: str  # the file, for messages


def resume_point(path: str | Path, origin: str | None = None, use: str = "") -> ResumePoint:
    """`origin`, `use`: as `read_checkpoint`'s (a run resumes a run of its own entry point). A
    checkpoint that does not read (cut short) is an error naming the newest one beside it that
    does."""
    try:
        ckpt = read_checkpoint(path, origin, use)
    except UnreadableCheckpoint as e:
        intact = newest_intact(Path(path))
        if intact is None:
            raise
        other, step = intact
        raise UserError(
            f"{e}; the newest intact checkpoint beside it is {other} (step {step}): "
            f"ckpt_path={other} continues from there"
        ) from e
    return ResumePoint(
        ckpt.step, ckpt.hparams, ckpt.tokenizer.to_str(), ckpt.data_record, str(path)
    )


def _raw_ckpt(path: str | Path, need=("state_dict", "config", "tokenizer")) -> dict:
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such checkpoint file")
    ckpt = torch_load(path)
    if not isinstance(ckpt, dict):
        raise UserError(f"{path}: holds a {type(ckpt).__name__}, not a bert_lightning .ckpt")
    check_record(ckpt, path)
    hparams = ckpt.get("hyper_parameters") or {}
    for key in need:
        if not (hparams if key == "config" else ckpt).get(key):
            raise UserError(f"{path}: no {key!r} in the checkpoint: not a bert_lightning .ckpt")
    return ckpt


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """`model.safetensors`, else `pytorch_model.bin` loaded weights-only (never unpickled)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return torch_load(folder / "pytorch_model.bin", mmap=False)
    raise MissingFileError(f"{folder}: neither model.safetensors nor pytorch_model.bin")


BERT_TOKENIZERS = (None, "BertTokenizer", "BertTokenizerFast")  # tokenizer_class values
# the tokenizer_config.json keys read, with their types
TOKENIZER_CONFIG = {
    "tokenizer_class": str | None,
    "tokenize_chinese_chars": bool,
    "strip_accents": bool | None,
    "do_lower_case": bool,
}


def as_transformers_reads(folder: Path, tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer` with the normalizer `transformers` gives a BERT tokenizer of `folder`: built
    from tokenizer_config.json (`do_lower_case`, `strip_accents`, `tokenize_chinese_chars`,
    with its defaults for a missing key), whatever tokenizer.json holds; a folder without that
    file, or of another tokenizer class, keeps its tokenizer's own."""
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return tokenizer
    settings = json_file(path, TOKENIZER_CONFIG)
    if settings.get("tokenizer_class") not in BERT_TOKENIZERS:
        return tokenizer
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
        strip_accents=settings.get("strip_accents"),
        lowercase=settings.get("do_lower_case", True),
    )
    return tokenizer


def check_tied(folder: Path, weights: dict[str, torch.Tensor]) -> None:
    """Our MLM decoder is the word embeddings: a folder whose decoder is a matrix of its own
    (`tie_word_embeddings: false`) would load into another function."""
    decoder = weights.get(DECODER)
    embeddings = weights.get(WORD_EMBEDDINGS, weights.get(WORD_EMBEDDINGS.removeprefix("bert.")))
    if decoder is not None and embeddings is not None and not torch.equal(decoder, embeddings):
        raise UserError(
            f"{folder}: {DECODER} differs from {WORD_EMBEDDINGS} (an untied decoder); this "
            "BERT ties them, so the MLM head would compute another function"
        )


def check_shapes(config: BertConfig, state: dict[str, torch.Tensor], where) -> None:
    """The shapes a config declares against the weights its file holds, before any model is
    built (on torch's meta device: no memory): a config declaring a width or depth its weights
    do not have (a 3.6 MB folder declaring 13 GiB of layers) is refused in one line."""
    with torch.device("meta"):
        declared = BertForPreTraining(config).state_dict()
    layers = {k.split(".")[3] for k in state if k.startswith("bert.encoder.layer.")}
    if layers and len(layers) != config.num_hidden_layers:
        raise UserError(
            f"{where}: declares num_hidden_layers={config.num_hidden_layers}; its weights hold "
            f"{len(layers)} layers"
        )
    for key, tensor in state.items():
        if (stored := tensor.untyped_storage().nbytes()) < tensor.numel() * tensor.element_size():
            raise UserError(
                f"{where}: {key} holds {tuple(tensor.shape)} in {stored} bytes (a broadcast "
                "view): weights are stored whole"
            )
        if key in declared and declared[key].shape != tensor.shape:
            raise UserError(
                f"{where}: {key} holds {tuple(tensor.shape)}, its config declares "
                f"{tuple(declared[key].shape)}"
            )


def load_hf_folder(folder: str | Path) -> Checkpoint:
    """A Hugging Face BERT folder: config.json, weights, tokenizer.json or vocab.txt (with
    tokenizer_config.json's settings, as `transformers` reads them)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise MissingFileError(f"{folder}: no config.json (not a Hugging Face model folder)")
    for name in ("tokenizer.json", "vocab.txt"):
        if (folder / name).is_file():
            tokenizer = as_transformers_reads(folder, load_tokenizer(folder / name))
            break
    else:
        raise MissingFileError(f"{folder}: neither tokenizer.json nor vocab.txt")
    config = config_from_hf(folder / "config.json")
    check_vocab(folder, config.vocab_size, tokenizer)
    weights = read_hf_weights(folder)
    check_tied(folder, weights)
    state = hf_to_ours(weights)
    check_shapes(config, state, folder)
    hparams, head = {}, folder / SCORE_HEAD
    if head.is_file():  # a fine-tuned bi-encoder's sentence-transformers folder
        hparams, classifier = score_head(folder, config)
        state |= classifier
    return Checkpoint(config, state, tokenizer, hparams, f"Hugging Face folder {folder}")


def score_head(folder: Path, config: BertConfig) -> tuple[dict, dict[str, torch.Tensor]]:
    """The hyper-parameters (task, max_seq_length) and head of the bi-encoder whose
    sentence-transformers folder this is (`interop.sentence_transformers_files`), each value
    checked, and the pooling, normalisation and length its modules declare the ones the head was
    trained on: read, the folder is the fine-tuned checkpoint it was exported from, and
    sentence-transformers computes its vectors."""
    path = folder / SCORE_HEAD
    hints = {"task": dict, "max_seq_length": int, "classifier": dict}
    record = json_file(path, hints)
    if missing := [k for k in hints if k not in record]:
        raise UserError(f"{path}: no {', '.join(missing)}; expected {', '.join(hints)}")
    head = record["classifier"]
    check_values(head, {"weight": float, "bias": float}, f"{path}: classifier")
    if missing := [k for k in ("weight", "bias") if k not in head]:
        raise UserError(f"{path}: classifier has no {', '.join(missing)}; expected weight, bias")
    if not all(math.isfinite(head[k]) for k in ("weight", "bias")):
        raise UserError(f"{path}: classifier {head}: expected finite numbers")
    task, length = record["task"], record["max_seq_length"]
    if (task.get("kind"), task.get("architecture")) != ("ad_relevance", "bi_encoder"):
        raise UserError(
            f"{path}: task kind={task.get('kind')!r} architecture={task.get('architecture')!r};"
            " a score head is a bi-encoder's (ad_relevance, bi_encoder)"
        )
    if task.get("pooling") not in ST_POOLINGS:
        raise UserError(
            f"{path}: task pooling={task.get('pooling')!r}; a bi-encoder's sentence-transformers "
            f"folder pools by one of {ST_POOLINGS} (BERT's pooler has no weights here)"
        )
    declared = declared_by(folder)
    said = (task["pooling"], True, length)
    modules = declared and (declared.pooling, declared.normalize, declared.max_seq_length)
    if modules != said:
        raise UserError(
            f"{path}: pooling, unit length, max_seq_length {said}; the folder's "
            f"sentence-transformers modules declare {modules}: sentence-transformers would "
            "compute other vectors than the head was trained on"
        )
    if not 1 <= length <= config.max_position_embeddings:
        raise UserError(
            f"{path}: max_seq_length {length}; expected 1 to the model's "
            f"{config.max_position_embeddings} positions"
        )
    hparams = {"config": asdict(config), "task": task, "max_seq_length": length}
    weight, bias = float(head["weight"]), float(head["bias"])
    return hparams, {
        "classifier.weight": torch.tensor([[weight]]),
        "classifier.bias": torch.tensor([bias]),
    }


def read_checkpoint(path: str | Path, origin: str | None = None, use: str = "") -> Checkpoint:
    """A `.ckpt` of ours (weights-only) or a Hugging Face BERT folder. `origin` (PRETRAINING,
    FINETUNING or HUGGING_FACE): the origin that `use` (the reader, named in the error) needs."""
    path = Path(path)
    if path.is_dir():
        ckpt = load_hf_folder(path)
    elif not path.is_file():
        raise MissingFileError(f"{path}: neither a checkpoint file nor a Hugging Face folder")
    else:
        raw = _raw_ckpt(path)
        hparams = dict(raw["hyper_parameters"])
        config = bert_config(hparams["config"], f"{path}: hyper_parameters.config")
        # an RTD checkpoint's encoder is its discriminator (`bert.*`): its generator and
        # replaced-token head have no place in a BERT model; a student distilled without an
        # MLM loss has an MLM head no loss trained
        objective = objective_of(hparams)
        untrained = objective == "distill" and not (hparams.get("soft_mlm") or hparams.get("mlm"))
        keep = "model.bert." if objective == "rtd" or untrained else "model."
        state = join_qkv(
            {k[len("model.") :]: v for k, v in raw["state_dict"].items() if k.startswith(keep)}
        )
        check_shapes(config, state, path)
        tokenizer = tokenizer_from_json(raw["tokenizer"], path)
        check_vocab(path, config.vocab_size, tokenizer)
        step = int(raw.get("global_step", 0))
        source = f"checkpoint {path}"
        ckpt = Checkpoint(config, state, tokenizer, hparams, source, step, raw.get(DATA_RECORD))
    check_origin(path, ckpt, origin, use)
    return ckpt


def write_model(path: str | Path, hparams: dict, state_dict: dict, tokenizer: str, **record):
    """A model as a `.ckpt` that every reader of a run's checkpoints takes: the module's
    hyper-parameters and `state_dict`, the tokenizer's JSON, no optimizer or loop state (a
    model, not a run to resume), and `record` (how it was made)."""
    out = {"hyper_parameters": hparams, "state_dict": state_dict, "tokenizer": tokenizer}
    with atomic_path(path) as tmp:
        torch.save(out | record, tmp)


def write_finetuned(path: str | Path, like: str | Path, ckpt: Checkpoint, record: dict) -> None:
    """`ckpt`'s weights as a `.ckpt` that every reader of `like` (the fine-tuned checkpoint
    they come from) takes, with its hyper-parameters and tokenizer and `record`."""
    raw = torch_load(like)
    state = {f"model.{k}": v.contiguous() for k, v in ckpt.state_dict.items()}
    kept = {k: raw[k] for k in ("global_step",) if k in raw}
    write_model(path, raw["hyper_parameters"], state, raw["tokenizer"], **kept, **record)
