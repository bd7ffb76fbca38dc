"""`bert-lightning fill-mask`: the top-k tokens and probabilities for each `[MASK]` of a text."""

from __future__ import annotations

import json

from bert_lightning.errors import UserError


def fill_mask(model_path, texts: list[str], top_k: int = 5) -> list[list[list[dict]]]:
    """For each text, for each `[MASK]` in order, the `top_k` {token, prob} best first; the
    first text the model cannot read is an error."""
    from bert_lightning.inference import fill_masks, load_mlm, unmaskable

    model, tok = load_mlm(model_path)
    encodings = tok.encode_batch(texts)
    if why := unmaskable(model, tok, texts, encodings):
        raise UserError(why)
    return fill_masks(model, tok, encodings, top_k)


def register(sub) -> None:
    p = sub.add_parser("fill-mask", help="top-k tokens for each [MASK] (needs an MLM head)")
    p.add_argument("model", help="a .ckpt from train.py or a Hugging Face BERT folder with cls.*")
    p.add_argument("text", nargs="+", help="texts with one or more [MASK]")
    p.add_argument("--top-k", type=int, default=5)
    p.set_defaults(func=_main)


def _main(args) -> None:
    for text, masks in zip(args.text, fill_mask(args.model, args.text, args.top_k), strict=True):
        print(json.dumps({"text": text, "masks": masks}, ensure_ascii=False))
