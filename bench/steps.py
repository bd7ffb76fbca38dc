"""What the step and time benchmarks share (train_step, fit_overhead, padded_step, rtd_step,
time_to_loss, hf_pretrain, serve): a `model=` preset's config, random MLM+NSP batches, the
`transformers` twin of a model with the same weights, one timed optimizer step, the Hugging
Face MLM collator, and the word-piece lengths of real tasks' rows."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict

import torch
from hydra.utils import instantiate
from torch.nn.attention import SDPBackend, sdpa_kernel

from bert_lightning.config import compose
from bert_lightning.data.masking import MaskingConfig, MLMCollator
from bert_lightning.interop import ours_to_hf
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.shipped import group_defaults

MASKING = MaskingConfig(**group_defaults("data", "_masking")["masking"])


def model_config(size: str, vocab_size: int = 30522) -> BertConfig:
    """The `model=<size>` preset, as train.py composes it."""
    return instantiate(compose("train", [f"model={size}"]).model, vocab_size=vocab_size)


def random_batch(c: BertConfig, batch: int, seq: int, device, seed: int = 0) -> dict:
    """Packed MLM+NSP examples: [CLS] A [SEP] B [SEP], masked as the collator masks (the
    shipped `data.masking`: 15% of the others picked), with its `mlm_positions`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, c.vocab_size, (batch, seq), generator=g)  # (B, T)
    half = seq // 2
    ids[:, 0], ids[:, half - 1], ids[:, -1] = 2, 3, 3  # [CLS], [SEP], [SEP]
    types = (torch.arange(seq) >= half).long().expand(batch, seq)  # (B, T)
    collator = MLMCollator(0, 4, [0, 1, 2, 3, 4], c.vocab_size, MASKING, padded=False)
    ids, labels = collator.mask(ids, g)  # (B, T) each
    nsp = torch.randint(0, 2, (batch,), generator=g)
    b = {"input_ids": ids, "token_type_ids": types, "labels": labels, "next_sentence_label": nsp}
    b["mlm_positions"] = collator.positions(labels)  # (B, K)
    return {k: v.to(device) for k, v in b.items()}


def without_positions(batch: dict) -> dict:
    """A batch as `transformers`' models take it (they have no `mlm_positions`)."""
    return {k: v for k, v in batch.items() if k != "mlm_positions"}


def hf_model(ours: BertForPreTraining, attn: str = "sdpa"):
    import transformers

    hf_cfg = transformers.BertConfig(**asdict(ours.config), attn_implementation=attn)
    hf = transformers.BertForPreTraining(hf_cfg)
    hf.load_state_dict(ours_to_hf(ours.state_dict()), strict=False)
    return hf


def make_step(model, opt, batch: dict, autocast_dtype=None):
    """One optimizer step. On a GPU attention may only use the flash or memory-efficient SDPA
    kernels (an error, not a silent fall-back to the math one, if it cannot)."""
    device_type = batch["input_ids"].device.type
    autocast = torch.autocast(device_type, dtype=autocast_dtype) if autocast_dtype else None
    fast_sdpa = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with (
            autocast or nullcontext(),
            sdpa_kernel(fast_sdpa) if device_type == "cuda" else nullcontext(),
        ):
            loss = model(**batch).loss
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def hf_collator(tokenizer, mlm_probability: float):
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    return DataCollatorForLanguageModeling(hf_tok, mlm_probability=mlm_probability)


# word pieces with [CLS] and [SEP], at the 0, 5, ..., 100th percentiles (8,000 training rows)
QUERY = [3, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7, 8, 8, 9, 10, 27]


TITLE = [4, 10, 12, 13, 14, 15, 16, 17, 18, 18, 19, 20, 21, 22, 23, 25, 26, 28, 30, 34, 48]


SST2 = [3, 4, 4, 5, 6, 6, 7, 7, 8, 9, 10, 11, 12, 14, 15, 18, 20, 23, 27, 33, 64]


def draw(percentiles: list[int], n: int, g: torch.Generator) -> torch.Tensor:
    """n lengths from a distribution given by its 5%-step percentiles (linear between them)."""
    u = torch.rand(n, generator=g) * (len(percentiles) - 1)  # (n,)
    lo = u.floor().long()
    p = torch.tensor(percentiles, dtype=torch.float)
    hi = (lo + 1).clamp(max=len(percentiles) - 1)
    return (p[lo] + (u - lo) * (p[hi] - p[lo])).round().long()  # (n,)
