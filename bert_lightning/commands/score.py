"""`bert-lightning score`: a fine-tuned model scores every (query, ad) row of a table. A file
is read as the model's task read its files (format, encoding, header, column names), unless
`--format`, `--encoding`, `--header/--no-header`, `--names` or `--column` say otherwise. With
`--index` (a bi-encoder's `bert-lightning index` of a catalogue), rows name an ad by its id
and the ads' vectors come from the index: only the queries are encoded."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from bert_lightning.choices import SCORE_BATCH
from bert_lightning.commands.options import (
    add_column_argument,
    add_table_arguments,
    at_least_one,
    column_options,
    table_options,
)

if TYPE_CHECKING:  # pandas, torch and the model are imported when a command runs
    import pandas as pd

    from bert_lightning.inference import Finetuned


def score(
    finetuned: Finetuned,
    rows: pd.DataFrame,
    batch_size=SCORE_BATCH,
    max_seq_length: int | None = None,
    source="input",
    progress=False,
) -> list[float]:
    """One score per row of the table (`score_rows`), from the text columns of the model's
    task. `max_seq_length`: None truncates as the model was fine-tuned."""
    from bert_lightning.data.tables import column, text_values
    from bert_lightning.inference import score_rows
    from bert_lightning.tasks.base import inputs

    task = finetuned.task
    (ka, kb), (a, b) = task.text_keys, task.text_columns
    texts = text_values(column(rows, a, source, ka), source, a)
    pairs = text_values(column(rows, b, source, kb), source, b) if b else None
    tok = finetuned.tokenizer(max_seq_length)
    rows = inputs({"text": texts, "pair": pairs})
    return score_rows(finetuned.model, task, tok, rows, batch_size, progress)


def register(sub) -> None:
    p = sub.add_parser("score", help="score (query, ad) rows with a fine-tuned relevance model")
    p.add_argument("model", help="a .ckpt written by finetune.py")
    p.add_argument("input", help="CSV/TSV/JSONL/Parquet with the query and ad columns")
    p.add_argument("output", help="the input with a `score` column (format by extension)")
    p.add_argument("--batch-size", type=at_least_one, default=SCORE_BATCH)
    p.add_argument(
        "--max-seq-length",
        type=at_least_one,
        help="default: the length the model was fine-tuned with",
    )
    add_table_arguments(p)
    add_column_argument(
        p,
        "query, ad for ad relevance; text, text_pair for sentence tasks; query, id with "
        "--index; default: the columns the model was fine-tuned on, and id",
    )
    p.add_argument(
        "--index",
        help="a bi-encoder's index of the catalogue (bert-lightning index): rows of (query, id)",
    )
    p.set_defaults(func=_main)


def _main(args) -> None:
    from bert_lightning.data.tables import write_table
    from bert_lightning.inference import load_finetuned

    finetuned = load_finetuned(args.model)
    if args.index:
        return _from_index(args, finetuned)
    options = table_options(args) | column_options(args.column, finetuned.task, scored_only=True)
    finetuned = finetuned.with_table_options(options)
    rows = finetuned.task.read_rows(args.input)
    rows["score"] = score(
        finetuned,
        rows,
        args.batch_size,
        args.max_seq_length,
        args.input,
        progress=True,
    )
    write_table(rows, Path(args.output))
    print(f"wrote {len(rows)} scored rows to {args.output}")


def _from_index(args, finetuned: Finetuned) -> None:
    """`score --index`: (query, id) rows scored from the index's ad vectors."""
    from bert_lightning.catalogue import check_encoder, indexed_pair_scores, read_index
    from bert_lightning.commands.options import columns
    from bert_lightning.data.tables import column, text_values, write_table
    from bert_lightning.errors import UserError

    if args.max_seq_length:
        raise UserError("--max-seq-length with --index: the index's ads were cut as fine-tuned")
    index = read_index(args.index)
    check_encoder(index, finetuned, args.model)
    names = {"query": finetuned.task.cfg.query_column, "id": "id"}
    names |= columns(args.column, list(names), "the rows' columns with --index")
    rows = finetuned.with_table_options(table_options(args)).task.read_rows(args.input)
    queries, ids = (
        text_values(column(rows, names[k], args.input, f"{k}_column"), args.input, names[k])
        for k in ("query", "id")
    )
    rows["score"] = indexed_pair_scores(finetuned, index, queries, ids, args.batch_size).tolist()
    write_table(rows, Path(args.output))
    print(f"wrote {len(rows)} scored rows to {args.output} (ads from {args.index})")
