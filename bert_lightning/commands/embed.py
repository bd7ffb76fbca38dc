"""`bert-lightning embed`: one vector per text, written as `.npy` (and JSONL if asked)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from bert_lightning.checkpoint import atomic_path, encoder_from, read_checkpoint
from bert_lightning.data.tables import DataError, column, read_table, text_values
from bert_lightning.model.heads import POOLINGS, pool


@torch.no_grad()
def embed(
    model_path, texts: list[str], pooling="cls", batch_size=32, max_seq_length=128, progress=False
) -> np.ndarray:
    pre = read_checkpoint(model_path)
    model, tok = encoder_from(pre), pre.tokenizer
    tok.enable_truncation(max_seq_length)
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    out = []
    for start in tqdm(range(0, len(texts), batch_size), disable=not progress, desc="embed"):
        enc = tok.encode_batch(texts[start : start + batch_size])
        ids = torch.tensor([e.ids for e in enc])  # (B, T)
        mask = torch.tensor([e.attention_mask for e in enc])  # (B, T)
        o = model(ids, torch.tensor([e.type_ids for e in enc]), mask, output_hidden_states=True)
        out.append(pool(o.hidden_states, mask, pooling).float().numpy())
    return np.concatenate(out) if out else np.zeros((0, model.config.hidden_size), np.float32)


def read_texts(path: str, column_name: str = "text") -> list[str]:
    """A `.txt` file (one text a line) or a table's `column_name`. A blank text is an error:
    its vector would be [CLS]/[SEP] alone, a silent row that matches nothing."""
    if Path(path).suffix == ".txt":
        texts = Path(path).read_text(encoding="utf-8").splitlines()
        where = "line {}"
    else:
        texts = text_values(column(read_table(path), column_name, path), path, column_name)
        where = f"row {{}}, column {column_name!r}"
    for i, text in enumerate(texts):
        if not text.strip():
            raise DataError(f"{path}: {where.format(i + 1)}: empty text (one vector per text)")
    return texts


def register(sub) -> None:
    p = sub.add_parser("embed", help="one vector per text (.npy, optional JSONL)")
    p.add_argument("model", help="a .ckpt of ours or a Hugging Face BERT folder")
    p.add_argument("input", help=".txt (one text a line) or CSV/TSV/JSONL/Parquet with --column")
    p.add_argument("output", help="the .npy file: one row per text, in input order")
    p.add_argument("--column", default="text")
    p.add_argument("--pooling", choices=list(POOLINGS), default="cls")
    p.add_argument("--jsonl", help="also write {text, embedding} lines here")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.set_defaults(func=_main)


def _main(args) -> None:
    texts = read_texts(args.input, args.column)
    vectors = embed(
        args.model, texts, args.pooling, args.batch_size, args.max_seq_length, progress=True
    )
    out = Path(args.output)
    with atomic_path(out) as tmp:
        np.save(tmp, vectors)
    if args.jsonl:
        with atomic_path(args.jsonl) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for text, v in zip(texts, vectors.tolist(), strict=True):
                f.write(json.dumps({"text": text, "embedding": v}, ensure_ascii=False) + "\n")
    print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} embeddings ({args.pooling}) to {out}")
