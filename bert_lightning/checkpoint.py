"""Weights to start from: a `.ckpt` of ours (pretraining or fine-tuning) or a Hugging Face BERT
folder, both brought into our key space (`bert.*`, `cls.*`, `classifier.*`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bert_lightning.interop import load_hf_folder, load_into
from bert_lightning.model import BertConfig, BertModel
from bert_lightning.training.pretrain import checkpoint_tokenizer


@dataclass
class Pretrained:
    config: BertConfig
    state_dict: dict[str, torch.Tensor]  # our key space, no Lightning `model.` prefix
    tokenizer: Tokenizer
    hparams: dict = field(default_factory=dict)  # the .ckpt's hyper_parameters ({} for HF)
    source: str = ""


def load_pretrained(path: str | Path) -> Pretrained:
    path = Path(path)
    if path.is_dir():
        hf = load_hf_folder(path)
        return Pretrained(hf.config, hf.state_dict, hf.tokenizer, {}, f"Hugging Face folder {path}")
    if not path.is_file():
        raise FileNotFoundError(f"{path}: neither a checkpoint file nor a Hugging Face folder")
    tokenizer = Tokenizer.from_str(checkpoint_tokenizer(str(path)))
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    hparams = dict(ckpt.get("hyper_parameters") or {})
    if "config" not in hparams or "state_dict" not in ckpt:
        raise ValueError(
            f"{path}: no hyper_parameters.config or state_dict: not a checkpoint of ours"
        )
    state = {k[6:]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    return Pretrained(
        BertConfig(**hparams["config"]), state, tokenizer, hparams, f"checkpoint {path}"
    )


def load_encoder(model: torch.nn.Module, pre: Pretrained) -> None:
    """The encoder weights (`bert.*`) into `model.bert`; heads stay at their initial values."""
    state = {k: v for k, v in pre.state_dict.items() if k.startswith("bert.")}
    if model.bert.pooler is None:
        state = {k: v for k, v in state.items() if not k.startswith("bert.pooler.")}
    load_into(model.bert, state, prefix="bert.")


def encoder_from(pre: Pretrained) -> BertModel:
    """A bare `BertModel` (for embeddings) with whatever encoder weights `pre` holds."""
    pooler = any(k.startswith("bert.pooler.") for k in pre.state_dict)
    holder = torch.nn.Module()
    holder.bert = BertModel(pre.config, add_pooling_layer=pooler)
    load_encoder(holder, pre)
    return holder.bert.eval()
