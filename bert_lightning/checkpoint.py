"""Reading weights to start from: a `.ckpt` of ours (pretraining or fine-tuning) or a Hugging
Face BERT folder, both brought into our key space (`bert.*`, `cls.*`, `classifier.*`) as one
`Checkpoint`. The one place that unpickles a checkpoint (`torch.load(weights_only=True)`);
training reads a resumed run's tokenizer here, commands read models here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bert_lightning.atomic import atomic_path, write_text  # noqa: F401  (re-exported)
from bert_lightning.data.tokenizer import load_tokenizer
from bert_lightning.interop import config_from_hf, hf_to_ours, load_into
from bert_lightning.model import BertConfig, BertModel


@dataclass
class Checkpoint:
    config: BertConfig
    state_dict: dict[str, torch.Tensor]  # our key space, no Lightning `model.` prefix
    tokenizer: Tokenizer
    hparams: dict = field(default_factory=dict)  # the .ckpt's hyper_parameters ({} for HF)
    source: str = ""


def torch_load(path: str | Path, mmap: bool = True) -> dict:
    """Weights-only (never runs pickled code), memory-mapped: a big checkpoint is not read
    whole to look at its tokenizer (old HF `.bin` files predate the format mmap needs)."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


@dataclass
class ResumePoint:
    """Where a `.ckpt` left its run: what `ckpt_path=` continues from."""

    step: int  # optimizer steps done (Lightning's global_step)
    hparams: dict  # the module's hyper_parameters (`optim` holds the schedule's total_steps)
    tokenizer: str  # the tokenizer the run was trained with (a resumed run must keep it)


def resume_point(path: str | Path) -> ResumePoint:
    ckpt = _raw_ckpt(path, need=("tokenizer",))
    return ResumePoint(
        int(ckpt.get("global_step", 0)), dict(ckpt.get("hyper_parameters") or {}), ckpt["tokenizer"]
    )


def _raw_ckpt(path: str | Path, need=("state_dict", "config", "tokenizer")) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint file")
    ckpt = torch_load(path)
    hparams = ckpt.get("hyper_parameters") or {}
    for key in need:
        if not (hparams if key == "config" else ckpt).get(key):
            raise ValueError(f"{path}: no {key!r} in the checkpoint: not a bert_lightning .ckpt")
    return ckpt


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """`model.safetensors`, else `pytorch_model.bin` loaded weights-only (never unpickled)."""
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(folder / "model.safetensors")
    if (folder / "pytorch_model.bin").is_file():
        return torch_load(folder / "pytorch_model.bin", mmap=False)
    raise FileNotFoundError(f"{folder}: neither model.safetensors nor pytorch_model.bin")


def load_hf_folder(folder: str | Path) -> Checkpoint:
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
    # HF files often fix padding/truncation (e.g. pad to 128): framing is our pipeline's job
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return Checkpoint(
        config_from_hf(folder / "config.json"),
        hf_to_ours(read_hf_weights(folder)),
        tokenizer,
        source=f"Hugging Face folder {folder}",
    )


def read_checkpoint(path: str | Path) -> Checkpoint:
    """A `.ckpt` of ours (weights-only) or a Hugging Face BERT folder."""
    path = Path(path)
    if path.is_dir():
        return load_hf_folder(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: neither a checkpoint file nor a Hugging Face folder")
    ckpt = _raw_ckpt(path)
    hparams = dict(ckpt["hyper_parameters"])
    config = BertConfig(**hparams["config"])
    state = {k[len("model.") :]: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    tokenizer = Tokenizer.from_str(ckpt["tokenizer"])
    return Checkpoint(config, state, tokenizer, hparams, f"checkpoint {path}")


def load_encoder(model: torch.nn.Module, ckpt: Checkpoint) -> None:
    """The encoder weights (`bert.*`) into `model.bert`; heads stay at their initial values."""
    state = {k: v for k, v in ckpt.state_dict.items() if k.startswith("bert.")}
    if model.bert.pooler is None:
        state = {k: v for k, v in state.items() if not k.startswith("bert.pooler.")}
    load_into(model.bert, state, prefix="bert.")


def encoder_from(ckpt: Checkpoint) -> BertModel:
    """A bare `BertModel` (for embeddings) with whatever encoder weights `ckpt` holds."""
    pooler = any(k.startswith("bert.pooler.") for k in ckpt.state_dict)
    holder = torch.nn.Module()
    holder.bert = BertModel(ckpt.config, add_pooling_layer=pooler)
    load_encoder(holder, ckpt)
    return holder.bert.eval()
