"""Hugging Face BERT checkpoints <-> this model: the one key map, used both ways, and the
export to a Hugging Face folder, a fine-tuned bi-encoder's as a sentence-transformers one
(reading one is `bert_lightning.checkpoint`).

Our parameter names are HF BERT's (`BertForPreTraining` key space: `bert.*`, `cls.*`, task
heads such as `classifier.*`), so the map is mostly identity; it only bridges what HF files
add or spell differently.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bert_lightning.atomic import atomic_path
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.fields import check_values, from_dict, json_file, read_json
from bert_lightning.model import BertConfig
from bert_lightning.model.flops import encoder_parameter_formula
from bert_lightning.model.heads import HEAD_POOLINGS

log = logging.getLogger(__name__)

WORD_EMBEDDINGS = "bert.embeddings.word_embeddings.weight"
DECODER = "cls.predictions.decoder.weight"  # tied: the word embeddings, in our .ckpt files too

# keys of HF files that carry no information of their own here
_DROPPED = (
    "bert.embeddings.position_ids",  # a buffer of 0..max_len
    DECODER,
    "cls.predictions.decoder.bias",  # the same tensor as cls.predictions.bias
)
_ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")

# sentence-transformers' pooling modes by their keys in an older Pooling config.json (a newer
# one says `pooling_mode`), in the order it concatenates those set
ST_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# of a sentence-transformers folder's modules (modules.json), what `embed_texts` computes
ST_MODULES = ("Transformer", "Pooling", "Normalize")
# a fine-tuned bi-encoder's sentence-transformers folder: its score head and task (ours), which
# `read_checkpoint` reads back so that `score` and `serve` score pairs as the checkpoint did
SCORE_HEAD = "score_head.json"
CLASSIFIER = ("classifier.weight", "classifier.bias")  # a bi-encoder's head: 1 -> 1
ST_POOLINGS = ("mean", "max")  # a bi-encoder's poolings that sentence-transformers computes


_QKV = ("query", "key", "value")  # HF's three projections: the row blocks of our `qkv`


def hf_to_ours(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF state dict (BertModel or BertFor*, legacy `gamma`/`beta` too) -> our key space."""
    out = {}
    for key, value in state.items():
        if key.startswith(_ENCODER_PREFIXES):  # saved from BertModel: no `bert.` prefix
            key = "bert." + key
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
            "LayerNorm.beta", "LayerNorm.bias"
        )
        if key not in _DROPPED:
            out[key] = value
    return join_qkv(out)


def join_qkv(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`query`, `key`, `value` (HF's layout) -> one `qkv`."""
    out = {}
    for key, value in state.items():
        head, sep, tail = key.rpartition(".attention.self.")
        part, _, kind = tail.partition(".")
        if not sep or part not in _QKV:
            out[key] = value
        elif part == "query":
            blocks = [state.get(f"{head}{sep}{p}.{kind}") for p in _QKV]
            if any(b is None for b in blocks):
                raise UserError(f"{key}: the checkpoint lacks its key or value projection")
            out[f"{head}{sep}qkv.{kind}"] = torch.cat(blocks)  # (3H, H) or (3H,)
    return out


def ours_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> the keys HF's `save_pretrained` writes for `BertForPreTraining` /
    `BertFor*`: `qkv` split into `query`, `key`, `value`; the tied decoder left out (HF
    re-ties it on load), so no tensor is stored twice and safetensors accepts the dict."""
    out = {}
    for key, value in state.items():
        head, sep, tail = key.rpartition(".attention.self.qkv.")
        if sep:
            blocks = zip(_QKV, value.chunk(3), strict=True)
            out |= {f"{head}.attention.self.{p}.{tail}": b for p, b in blocks}
        elif key not in _DROPPED:
            out[key] = value
    return out


def config_from_hf(path: str | Path) -> BertConfig:
    """`config.json` of a HF BERT -> BertConfig (fields we do not model are ignored)."""
    raw = json_file(path, {"model_type": str, "position_embedding_type": str})
    if raw.get("model_type", "bert") != "bert":
        raise UserError(f"{path}: model_type={raw['model_type']!r}; expected 'bert'")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise UserError(f"{path}: only absolute position embeddings are supported")
    names = {f.name for f in fields(BertConfig)}
    return bert_config({k: v for k, v in raw.items() if k in names}, str(path))


def machine_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def bert_config(raw: dict, where: str) -> BertConfig:
    """The BertConfig a file declares (`where`: the file and key, for the message): its
    fields typed, its sizes positive, and its weights within this machine's memory, so that a
    file declaring `num_hidden_layers: 100000` is refused in one line before allocation."""
    config = from_dict(BertConfig, raw, where)
    sizes = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    sizes += ("intermediate_size", "max_position_embeddings", "type_vocab_size")
    if bad := [f"{k}={getattr(config, k)}" for k in sizes if getattr(config, k) < 1]:
        raise UserError(f"{where}: {', '.join(bad)}; expected sizes of at least 1")
    need, have = 4 * encoder_parameter_formula(config), machine_memory()  # fp32 weights
    if need > have:
        raise UserError(
            f"{where}: a model of {need // 4:,} parameters ({need / 2**30:,.1f} GiB in fp32) "
            f"exceeds this machine's memory ({have / 2**30:,.1f} GiB)"
        )
    return config


def load_into(model: torch.nn.Module, state: dict[str, torch.Tensor], prefix: str = "") -> None:
    """Load what the checkpoint has; say what the model keeps at its initial values (a new
    task head, or an MLM head that an encoder-only checkpoint lacks) and refuse keys that fit
    nowhere or shapes that differ."""
    own = model.state_dict()
    state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    unexpected = sorted(set(state) - set(own))
    if unexpected:
        raise KeyError(f"checkpoint keys with no place in {type(model).__name__}: {unexpected}")
    for k, v in state.items():
        if own[k].shape != v.shape:
            raise ValueError(f"{k}: checkpoint shape {tuple(v.shape)}, model {tuple(own[k].shape)}")
    missing = sorted(set(own) - set(state) - {DECODER})
    if missing:
        log.info("not in the checkpoint, left at initial values: %s", missing)
    model.load_state_dict(state, strict=False)


# --- export: our weights -> a Hugging Face folder -------------------------------------------

# HF classes of our state dicts (our names are HF's)
HF_ARCHITECTURES = (
    "BertForPreTraining",
    "BertForMaskedLM",
    "BertModel",
    "BertForSequenceClassification",
    "BertForTokenClassification",
)


# an MLM head's own tensors (its decoder is tied to the word embeddings)
MLM_HEAD = ("cls.predictions.transform.dense.weight", "cls.predictions.bias")


def has_mlm_head(keys) -> bool:
    """Whether state-dict keys (our key space) hold an MLM head: the one test of it, for
    fill-mask, evaluate, a distillation's soft targets, an export's architecture and an
    `init_from=` start."""
    return all(k in keys for k in MLM_HEAD)


def hf_architecture(state: dict[str, torch.Tensor]) -> str:
    """The `transformers` class a state dict (our key space) loads into without missing keys,
    told apart by its heads: a task head is `classifier.*`, on a pooler for HF's sequence
    model, without one for its token model (a checkpoint's task says which: `hf_head`)."""
    keys = set(state)
    if "classifier.weight" in keys:
        if "bert.pooler.dense.weight" not in keys:
            return "BertForTokenClassification"
        return "BertForSequenceClassification"
    if has_mlm_head(keys):
        has_nsp = "cls.seq_relationship.weight" in keys and "bert.pooler.dense.weight" in keys
        return "BertForPreTraining" if has_nsp else "BertForMaskedLM"
    return "BertModel"


def hf_config(
    config: BertConfig,
    architecture: str,
    dtype: torch.dtype = torch.float32,
    labels: list[str] | None = None,
    problem_type: str | None = None,
    num_labels: int | None = None,
    target_scale: tuple[float, float] | None = None,
) -> dict:
    """`config.json` with `transformers.BertConfig` fields. Pre-LN blocks have no HF BERT
    equivalent: refused rather than exported into a model that would compute something else.
    `target_scale`: a regression head's (mean, std), recorded as folded into its weights (so
    that no reader applies it again)."""
    if config.pre_layer_norm:
        raise UserError(
            "model.pre_layer_norm=true: Hugging Face BERT has post-LN blocks only, so a pre-LN "
            "model cannot be exported to it (its weights would load but compute another function)"
        )
    if architecture not in HF_ARCHITECTURES:
        raise UserError(f"architecture={architecture!r}; expected one of {HF_ARCHITECTURES}")
    ours = ("pre_layer_norm", "position_embedding_init")  # not transformers' fields
    out = {k: v for k, v in asdict(config).items() if k not in ours}
    out.update(
        architectures=[architecture],
        model_type="bert",
        position_embedding_type="absolute",
        classifier_dropout=None,
        tie_word_embeddings=True,
        use_cache=True,
        dtype=str(dtype).removeprefix("torch."),
    )
    if num_labels is not None:
        names = labels or [f"LABEL_{i}" for i in range(num_labels)]
        if len(names) != num_labels:
            raise UserError(f"{len(names)} label names for a head of {num_labels} outputs")
        out["id2label"] = {str(i): str(n) for i, n in enumerate(names)}
        out["label2id"] = {str(n): i for i, n in enumerate(names)}
        if problem_type:
            out["problem_type"] = problem_type
    if target_scale is not None:
        mean, std = target_scale
        out["target_scale"] = {"mean": mean, "std": std, "folded_into_classifier": True}
    return out


# what a Hugging Face folder's config.json says of its head: kept when it is exported again
HEAD_FIELDS = ("id2label", "label2id", "problem_type", "target_scale")


def hf_folder_head(folder: str | Path) -> tuple[dict, int | None]:
    """A Hugging Face folder's `HEAD_FIELDS` (config.json) and the length `transformers`
    truncates its texts to (`model_max_length` of tokenizer_config.json; None if it says none):
    what its export again keeps."""
    folder = Path(folder)
    raw = json_file(folder / "config.json", {"problem_type": str | None})
    tokenizer_config = folder / "tokenizer_config.json"
    lengths = {"model_max_length": int | None}
    tok = json_file(tokenizer_config, lengths) if tokenizer_config.is_file() else {}
    return {k: raw[k] for k in HEAD_FIELDS if k in raw}, tok.get("model_max_length")


def folded(state: dict[str, torch.Tensor], target_scale: tuple[float, float]) -> dict:
    """A regression head's standardised output `w.h + b` turned into the target's scale,
    `(w.h + b) std + mean = (std w).h + (std b + mean)`: `transformers` then predicts what
    `bert-lightning score` does."""
    mean, std = target_scale
    w, b = state["classifier.weight"], state["classifier.bias"]  # (1, H), (1,)
    if len(b) != 1:
        raise UserError(f"a target scale for a head of {len(b)} outputs; expected 1")
    return state | {"classifier.weight": w * std, "classifier.bias": b * std + mean}


def hf_tokenizer_files(tok: Tokenizer, model_max_length: int) -> dict[str, str]:
    """`tokenizer.json` (ours, as is), `vocab.txt`, `tokenizer_config.json` and
    `special_tokens_map.json` for `transformers`' BERT tokenizer."""
    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = sorted(vocab, key=vocab.get)
    if [vocab[t] for t in by_id] != list(range(len(by_id))):
        raise UserError("tokenizer ids are not 0..N-1 without gaps: no vocab.txt can hold them")
    raw = json.loads(tok.to_str())
    norm = raw.get("normalizer") or {}
    if norm.get("type") != "BertNormalizer":
        raise UserError(f"normalizer {norm.get('type')!r}: only BERT's can be exported")
    lower = bool(norm.get("lowercase", True))
    specials = {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    }
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lower,
        "tokenize_chinese_chars": bool(norm.get("handle_chinese_chars", True)),
        "strip_accents": norm.get("strip_accents"),
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        **specials,
    }
    return {
        "tokenizer.json": tok.to_str(),
        "vocab.txt": "\n".join(by_id) + "\n",
        "tokenizer_config.json": json.dumps(tokenizer_config, indent=2) + "\n",
        "special_tokens_map.json": json.dumps(specials, indent=2) + "\n",
    }


def sentence_transformers_files(
    state: dict[str, torch.Tensor], task: dict, max_seq_length: int, width: int
) -> dict[str, str]:
    """A fine-tuned bi-encoder (`task.architecture=bi_encoder`) as sentence-transformers reads
    a model: the encoder, pooled as it was fine-tuned, normalised (its `encode` then gives the
    vectors whose dot product is the cosine the head reads), truncating each text to
    `max_seq_length`; and `SCORE_HEAD`, the task and the head (1 -> 1) that maps the cosine of
    a query and an ad to the logit of their 0-1 score. Pooled by BERT's pooler (`cls`: a dense
    layer and tanh), it has no sentence-transformers pooling: refused."""
    pooling = task["pooling"]
    if pooling not in ST_POOLINGS:
        raise UserError(
            f"task.pooling={pooling}: a bi-encoder pooled by BERT's pooler (dense + tanh) has no "
            "sentence-transformers Pooling mode; export-onnx exports it"
        )
    modules = [
        (0, "", "Transformer"),
        (1, "1_Pooling", "Pooling"),
        (2, "2_Normalize", "Normalize"),
    ]
    pool = {"word_embedding_dimension": width}
    pool |= {key: mode == pooling for key, mode in ST_POOLING_KEYS.items()}
    (weight,), (bias,) = state[CLASSIFIER[0]].flatten().tolist(), state[CLASSIFIER[1]].tolist()
    head = {
        "score": "sigmoid(weight * cos(query vector, ad vector) + bias)",
        "classifier": {"weight": weight, "bias": bias},
        "task": task,
        "max_seq_length": max_seq_length,
    }
    as_json = lambda value: json.dumps(value, indent=2) + "\n"  # noqa: E731
    return {
        "modules.json": as_json(
            [
                {
                    "idx": i,
                    "name": str(i),
                    "path": path,
                    "type": f"sentence_transformers.models.{t}",
                }
                for i, path, t in modules
            ]
        ),
        "sentence_bert_config.json": as_json(
            {"max_seq_length": max_seq_length, "do_lower_case": False}
        ),
        "config_sentence_transformers.json": as_json({"similarity_fn_name": "cosine"}),
        "1_Pooling/config.json": as_json(pool),
        "2_Normalize/": "",  # a module without settings: its folder
        SCORE_HEAD: as_json(head),
    }


def export_hf_folder(
    state: dict[str, torch.Tensor],
    config: BertConfig,
    tokenizer: Tokenizer,
    out_dir: str | Path,
    head: tuple[str, str | None] | None = None,
    labels: list[str] | None = None,
    overwrite: bool = False,
    target_scale: tuple[float, float] | None = None,
    max_seq_length: int | None = None,
    kept: dict | None = None,
    extra: dict[str, str] | None = None,
) -> Path:
    """Write a folder that `transformers`' `from_pretrained` reads: config.json,
    model.safetensors and the tokenizer files. `state` is in our key space; `head`, the HF
    class and problem type of a fine-tuned model (its task says them: `tasks.kinds.hf_head`;
    None: the class told from the state's heads) and `labels`, a classifier's label names;
    `target_scale`, a regression head's (mean, std), folded into its weights (`folded`);
    `max_seq_length`, what `transformers` truncates to (`model_max_length`; None: the model's
    positions); `kept`, config.json fields of a Hugging Face folder exported again
    (`hf_folder_head`); `extra`, more files by their path in the folder (a path ending in `/`:
    a folder; `sentence_transformers_files`). Written into a temporary sibling folder, then
    renamed: never a half-written folder."""
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; choose a new folder (or overwrite=True)")
    arch, problem_type = head or (hf_architecture(state), None)
    if target_scale is not None:
        state = folded(state, target_scale)
    weights = {k: v.detach().contiguous() for k, v in ours_to_hf(state).items()}
    dtype = weights[WORD_EMBEDDINGS].dtype
    classifier = {}
    if "classifier.weight" in weights:
        num_labels = weights["classifier.weight"].shape[0]
        classifier = dict(num_labels=num_labels, labels=labels, problem_type=problem_type)
    hf = hf_config(config, arch, dtype, **classifier, target_scale=target_scale) | (kept or {})
    files = {"config.json": json.dumps(hf, indent=2) + "\n"}
    length = min(max_seq_length or config.max_position_embeddings, config.max_position_embeddings)
    files.update(hf_tokenizer_files(tokenizer, length))
    files.update(extra or {})

    with atomic_path(out_dir, folder=True) as tmp:  # an old folder goes once the new is whole
        save_file(weights, tmp / "model.safetensors", metadata={"format": "pt"})
        for name, text in files.items():
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            if name.endswith("/"):
                (tmp / name).mkdir(exist_ok=True)
            else:
                (tmp / name).write_text(text, encoding="utf-8")
    log.info("wrote %s (%s, %d tensors)", out_dir, arch, len(weights))
    return out_dir


@dataclass(frozen=True)
class Declared:
    """How a sentence-transformers folder makes its vectors (modules.json, its modules'
    configs): `embed_texts` makes them so, as `SentenceTransformer.encode` does."""

    source: Path  # the Pooling module's config.json, named when another pooling is asked
    pooling: str
    normalize: bool  # a Normalize module: unit-length vectors
    max_seq_length: int | None  # None: as many positions as the model has


def declared_by(folder: Path) -> Declared | None:
    """What the sentence-transformers folder `folder` declares (None: no modules.json, not
    one), read as sentence-transformers reads it; what `embed_texts` cannot compute (another
    module, another pooling) is refused rather than left out."""
    path = folder / "modules.json"
    if not path.is_file():
        return None
    paths = {}  # module kind -> its folder
    for module in read_json(path, list):
        if not isinstance(module, dict):
            raise UserError(f"{path}: holds a {type(module).__name__}; expected module objects")
        check_values(module, {"type": str, "path": str}, str(path))
        kind = str(module.get("type")).rsplit(".", 1)[-1]
        if kind not in ST_MODULES:
            only = "/".join(ST_MODULES)
            raise UserError(
                f"{path}: a {module.get('type')} module; embed runs {only} modules only"
            )
        paths[kind] = module.get("path") or ""
    if "Pooling" not in paths:
        raise UserError(f"{path}: no Pooling module; embed gives one vector per text")
    source = folder / paths["Pooling"] / "config.json"
    if not source.resolve().is_relative_to(folder.resolve()):
        raise UserError(f"{path}: the Pooling module's path {paths['Pooling']!r} leaves {folder}")
    if not source.is_file():
        raise MissingFileError(f"{source}: no such file (the Pooling module of {path})")
    config = json_file(source, dict.fromkeys(ST_POOLING_KEYS, bool))
    modes = [mode for key, mode in ST_POOLING_KEYS.items() if config.get(key)]
    pooling = config.get("pooling_mode") or modes or "mean"  # as sentence-transformers reads it
    if isinstance(pooling, list) and len(pooling) == 1:
        pooling = pooling[0]
    if pooling not in HEAD_POOLINGS:
        raise UserError(f"{source}: pooling {pooling}; embed pools by one of {list(HEAD_POOLINGS)}")
    # its length: sentence_bert_config.json's, else (a newer save) its tokenizer's
    st_config = folder / "sentence_bert_config.json"
    st = json_file(st_config, {"max_seq_length": int | None}) if st_config.is_file() else {}
    length = st.get("max_seq_length") or hf_folder_head(folder)[1]
    return Declared(source, pooling, "Normalize" in paths, length)
