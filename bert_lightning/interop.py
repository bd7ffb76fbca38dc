"""Hugging Face BERT checkpoints <-> this model: the one key map, used both ways.

Our parameter names are HF BERT's (`BertForPreTraining` key space: `bert.*`, `cls.*`, task
heads such as `classifier.*`), so the map is mostly identity; it only bridges what HF files
add or spell differently.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bert_lightning.model import BertConfig
from bert_lightning.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

# keys of HF files that carry no information of their own here
_DROPPED = (
    "bert.embeddings.position_ids",  # a buffer of 0..max_len
    "cls.predictions.decoder.weight",  # tied to bert.embeddings.word_embeddings.weight
    "cls.predictions.decoder.bias",  # the same tensor as cls.predictions.bias
)
_ENCODER_PREFIXES = ("embeddings.", "encoder.", "pooler.")


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
    return out


def ours_to_hf(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict -> HF `BertForPreTraining` / `BertFor*` keys (decoder written out, as HF
    files carry it)."""
    out = dict(state)
    if "cls.predictions.bias" in out:
        out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
        out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    return out


def config_from_hf(path: str | Path) -> BertConfig:
    """`config.json` of a HF BERT -> BertConfig (fields we do not model are ignored)."""
    raw = json.loads(Path(path).read_text())
    if raw.get("model_type", "bert") != "bert":
        raise ValueError(f"{path}: model_type={raw['model_type']!r}; expected 'bert'")
    if raw.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{path}: only absolute position embeddings are supported")
    names = {f.name for f in fields(BertConfig)}
    return BertConfig(**{k: v for k, v in raw.items() if k in names})


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """`model.safetensors`, else `pytorch_model.bin` loaded weights-only (never unpickled)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"{folder}: neither model.safetensors nor pytorch_model.bin")


@dataclass
class HFCheckpoint:
    config: BertConfig
    state_dict: dict[str, torch.Tensor]  # our key space
    tokenizer: Tokenizer


def load_hf_folder(folder: str | Path) -> HFCheckpoint:
    """A Hugging Face BERT folder: config.json, weights, tokenizer.json or vocab.txt."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: no config.json (not a Hugging Face model folder)")
    for name in ("tokenizer.json", "vocab.txt"):
        if (folder / name).is_file():
            tokenizer = load_tokenizer(folder / name)
            break
    else:
        raise FileNotFoundError(f"{folder}: neither tokenizer.json nor vocab.txt")
    return HFCheckpoint(
        config_from_hf(folder / "config.json"), hf_to_ours(read_hf_weights(folder)), tokenizer
    )


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
    missing = sorted(set(own) - set(state) - {"cls.predictions.decoder.weight"})
    if missing:
        log.info("not in the checkpoint, left at initial values: %s", missing)
    model.load_state_dict(state, strict=False)
