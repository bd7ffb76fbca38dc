"""`bert-lightning fill-mask`: the top-k tokens and probabilities for each `[MASK]` of a text."""

from __future__ import annotations

import json

import torch

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.errors import UserError
from bert_lightning.interop import load_into
from bert_lightning.model import BertForPreTraining


def load_mlm(path, pre=None):
    """(BertForPreTraining in eval mode, tokenizer) of a checkpoint with an MLM head (`pre`: it,
    read already)."""
    pre = pre or read_checkpoint(path)
    if "cls.predictions.transform.dense.weight" not in pre.state_dict:
        raise UserError(
            f"{path}: no MLM head (cls.predictions.*) in these weights; fill-mask needs one"
        )
    model = BertForPreTraining(pre.config)
    load_into(
        model,
        {k: v for k, v in pre.state_dict.items() if k.startswith(("bert.", "cls.predictions."))},
    )
    return model.eval(), pre.tokenizer


@torch.no_grad()
def fill_mask(model_path, texts: list[str], top_k: int = 5) -> list[list[list[dict]]]:
    """For each text, for each `[MASK]` in order, the `top_k` {token, prob} best first."""
    model, tok = load_mlm(model_path)
    mask_id = tok.token_to_id("[MASK]")
    results = []
    for text in texts:
        ids = torch.tensor([tok.encode(text).ids])  # (1, T)
        if not (ids == mask_id).any():
            raise UserError(f"no [MASK] in {text!r}")
        h = model.bert(ids).last_hidden_state[ids == mask_id]  # (M, H)
        probs = model.cls.predictions(h).float().softmax(-1)  # (M, V)
        p, idx = probs.topk(top_k, dim=-1)  # (M, k)
        results.append(
            [
                [
                    {"token": tok.id_to_token(i), "prob": q}
                    for i, q in zip(r_i.tolist(), r_p.tolist(), strict=True)
                ]
                for r_i, r_p in zip(idx, p, strict=True)
            ]
        )
    return results


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="top-k tokens for each [MASK] (needs an MLM head)")
    p.add_argument("model", help="a .ckpt from train.py or a Hugging Face BERT folder with cls.*")
    p.add_argument("text", nargs="+", help="texts with one or more [MASK]")
    p.add_argument("--top-k", type=int, default=5)
    p.set_defaults(func=_main)


def _main(args) -> None:
    for text, masks in zip(args.text, fill_mask(args.model, args.text, args.top_k), strict=True):
        print(json.dumps({"text": text, "masks": masks}, ensure_ascii=False))
