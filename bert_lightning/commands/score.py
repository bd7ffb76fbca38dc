"""`bert-lightning score`: a fine-tuned model scores every (query, ad) row of a table."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.data.tables import collate, column, read_table, text_values, write_table
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.interop import load_into
from bert_lightning.tasks.kinds import make_task

# what `score` truncates to for a checkpoint written before max_seq_length was stored
DEFAULT_MAX_SEQ_LENGTH = 128


def load_finetuned(path):
    """(task, model in eval mode, tokenizer, max_seq_length it was fine-tuned with) from a
    `.ckpt` written by finetune.py."""
    pre = read_checkpoint(path)
    if "task" not in pre.hparams:
        raise ValueError(f"{path}: not a fine-tuned checkpoint (no task in its hyper_parameters)")
    task = make_task(pre.hparams["task"])
    model = task.build_model(pre.config)
    load_into(model, pre.state_dict)
    max_len = pre.hparams.get("max_seq_length") or DEFAULT_MAX_SEQ_LENGTH
    return task, model.eval(), pre.tokenizer, max_len


@torch.no_grad()
def score(
    model_path,
    rows: pd.DataFrame,
    columns=(None, None),
    batch_size=64,
    max_seq_length: int | None = None,
    source="input",
    progress=False,
) -> list[float]:
    """One score per row: the relevance probability (ad_relevance), the predicted value
    (regression) or the second label's probability (two-class classification).
    `max_seq_length`: None truncates as the model was fine-tuned."""
    task, model, tok, trained_len = load_finetuned(model_path)
    max_seq_length = max_seq_length or trained_len
    a, b = (given or default for given, default in zip(columns, task.text_columns, strict=True))
    table = {
        "text": text_values(column(rows, a, source), source, a),
        "group": list(range(len(rows))),
    }
    table["pair"] = text_values(column(rows, b, source), source, b) if b else None
    feats = task.encode(table, tok, max_seq_length)
    pad = partial(collate, pad_id=special_ids(tok)["[PAD]"])
    out: list[float] = []
    for start in tqdm(range(0, len(feats), batch_size), disable=not progress, desc="score"):
        batch = pad(feats[start : start + batch_size])
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        out.extend(task.scores(logits).tolist())
    return out


def register(sub) -> None:
    p = sub.add_parser("score", help="score (query, ad) rows with a fine-tuned relevance model")
    p.add_argument("model", help="a .ckpt written by finetune.py")
    p.add_argument("input", help="CSV/TSV/JSONL/Parquet with the query and ad columns")
    p.add_argument("output", help="the input with a `score` column (format by extension)")
    p.add_argument("--query-column", help="default: the column the model was trained on")
    p.add_argument("--ad-column", help="default: the column the model was trained on")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--max-seq-length", type=int, help="default: the length the model was fine-tuned with"
    )
    p.set_defaults(func=_main)


def _main(args) -> None:
    rows = read_table(args.input)
    rows["score"] = score(
        args.model,
        rows,
        (args.query_column, args.ad_column),
        args.batch_size,
        args.max_seq_length,
        args.input,
        progress=True,
    )
    write_table(rows, Path(args.output))
    print(f"wrote {len(rows)} scored rows to {args.output}")
