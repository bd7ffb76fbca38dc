"""`bert-lightning score`: a fine-tuned model scores every (query, ad) row of a table. A file
is read as the model's task read its files (format, encoding, header, column names), unless
`--format`, `--encoding`, `--header/--no-header` or `--names` say otherwise."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from bert_lightning.checkpoint import FINETUNING, read_checkpoint
from bert_lightning.data.tables import collate, column, text_values, write_table
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.interop import load_into
from bert_lightning.training.finetune_module import FinetuneModule

# what `score` truncates to for a checkpoint written before max_seq_length was stored
DEFAULT_MAX_SEQ_LENGTH = 128


def finetuned_module(path, use: str = "score", pre=None) -> FinetuneModule:
    """The FinetuneModule of a `.ckpt` written by finetune.py (`pre`: it, read already), in
    eval mode: its task, model, metrics, tokenizer and max_seq_length as fine-tuning left them."""
    pre = pre or read_checkpoint(path, FINETUNING, use)
    h = pre.hparams
    module = FinetuneModule(
        asdict(pre.config),
        h["task"],
        h.get("optim") or {},
        tokenizer_json=pre.tokenizer.to_str(),
        max_seq_length=h.get("max_seq_length") or DEFAULT_MAX_SEQ_LENGTH,
    )
    load_into(module.model, pre.state_dict)
    return module.eval()


def load_finetuned(path):
    """(task, model in eval mode, tokenizer, max_seq_length it was fine-tuned with) from a
    `.ckpt` written by finetune.py."""
    m = finetuned_module(path)
    return m.task, m.model, Tokenizer.from_str(m.tokenizer_json), m.hparams.max_seq_length


TABLE_HELP = "default: as the model's task read its files (else by extension / utf-8 / a header)"


def add_table_arguments(p) -> None:
    """How to read the input table; by default as the checkpoint's task read its files."""
    p.add_argument("--format", choices=["csv", "tsv", "jsonl", "parquet"], help=TABLE_HELP)
    p.add_argument("--encoding", help=TABLE_HELP)
    p.add_argument("--header", action=argparse.BooleanOptionalAction, help=TABLE_HELP)
    p.add_argument("--names", help="column names of a headerless file, comma-separated")


def table_options(args) -> dict:
    """The table keys of a task config (format, encoding, header, names) given on the command
    line; what is not given stays as the checkpoint's task has it."""
    given = {k: v for k, v in (("format", args.format), ("encoding", args.encoding)) if v}
    if args.header is not None:
        given["header"] = args.header
    if args.names:
        given["names"] = args.names.split(",")
    elif args.header:  # the header row names the columns, not the task's `names`
        given["names"] = None
    return given


@torch.no_grad()
def score(
    module: FinetuneModule,
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
    task, model, tok = module.task, module.model, Tokenizer.from_str(module.tokenizer_json)
    max_seq_length = max_seq_length or module.hparams.max_seq_length
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
    add_table_arguments(p)
    p.set_defaults(func=_main)


def _main(args) -> None:
    module = finetuned_module(args.model)
    module.task.cfg.update(table_options(args))
    rows = module.task.read_rows(args.input)
    rows["score"] = score(
        module,
        rows,
        (args.query_column, args.ad_column),
        args.batch_size,
        args.max_seq_length,
        args.input,
        progress=True,
    )
    write_table(rows, Path(args.output))
    print(f"wrote {len(rows)} scored rows to {args.output}")
