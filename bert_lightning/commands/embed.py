"""`bert-lightning embed`: one vector per text, written as `.npy` (and JSONL if asked)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from bert_lightning.atomic import atomic_path
from bert_lightning.choices import EMBED_BATCH, EMBED_LENGTH, EMBED_POOLING, POOLINGS
from bert_lightning.commands.options import (
    add_column_argument,
    add_table_arguments,
    at_least_one,
    columns,
    table_options,
)

if TYPE_CHECKING:  # numpy, torch and the readers are imported when a command runs
    import numpy as np


def embed(
    model_path,
    texts: list[str],
    pooling: str | None = None,
    batch_size=EMBED_BATCH,
    max_seq_length: int | None = None,
    progress=False,
) -> np.ndarray:
    """(N, H) one vector per text (`embed_texts`) of the model at `model_path`; `pooling`,
    `max_seq_length` None: the model's (an ONNX export's or a sentence-transformers folder's
    own, `load_embedder`, `pooling_of`)."""
    from bert_lightning.inference import embed_texts, load_embedder

    model, tok = load_embedder(model_path, max_seq_length)
    return embed_texts(model, tok, texts, pooling, batch_size, progress).numpy()


def read_texts(path: str, column_name: str = "text", **table) -> list[str]:
    """A `.txt` file (one text a line) or a table's `column_name`, read with `table`'s options
    (format, encoding, header, names: `table_options`) over a table's defaults. A blank text is
    an error: its vector would be [CLS]/[SEP] alone, a silent row that matches nothing."""
    from bert_lightning.data.tables import TABLE, DataError, column, read_table, text_values

    if Path(path).suffix == ".txt":
        texts = Path(path).read_text(encoding=(TABLE | table)["encoding"])  # over the defaults
        texts = re.split(r"\r\n|\r|\n", texts)  # lines as a table's: not at U+2028, \f, ...
        texts = texts[:-1] if texts[-1] == "" else texts  # a last line's end
        where = "line {}"
    else:
        rows = read_table(path, table.pop("format", None), **table)
        texts = text_values(column(rows, column_name, path, "text_column"), path, column_name)
        where = f"row {{}}, column {column_name!r}"
    for i, text in enumerate(texts):
        if not text.strip():
            raise DataError(f"{path}: {where.format(i + 1)}: empty text (one vector per text)")
    return texts


def register(sub) -> None:
    p = sub.add_parser("embed", help="one vector per text (.npy, optional JSONL)")
    p.add_argument(
        "model", help="a .ckpt of ours or a Hugging Face BERT folder (sentence-transformers too)"
    )
    p.add_argument(
        "input", help=".txt (one text a line) or CSV/TSV/JSONL/Parquet with --column text=NAME"
    )
    p.add_argument("output", help="the .npy file: one row per text, in input order")
    add_table_arguments(p)
    add_column_argument(p, "text; default: text")
    p.add_argument(
        "--pooling",
        choices=list(POOLINGS),
        help=f"default: {EMBED_POOLING}, or the pooling an export-onnx folder was exported "
        "with, or a sentence-transformers folder declares (then unit length if it says so)",
    )
    p.add_argument("--jsonl", help="also write {text, embedding} lines here")
    p.add_argument("--batch-size", type=at_least_one, default=EMBED_BATCH)
    p.add_argument(
        "--max-seq-length",
        type=at_least_one,
        help=f"default: {EMBED_LENGTH}, or the length an export-onnx folder was exported with, "
        "or a sentence-transformers folder's (sentence_bert_config.json)",
    )
    p.set_defaults(func=_main)


def _main(args) -> None:
    import numpy as np

    from bert_lightning.inference import embed_texts, load_embedder, pooling_of

    named = columns(args.column, ["text"], "the column of the texts")
    texts = read_texts(args.input, *named.values(), **table_options(args))  # none: `text`
    model, tok = load_embedder(args.model, args.max_seq_length)
    pooling = pooling_of(model, args.pooling)
    vectors = embed_texts(model, tok, texts, pooling, args.batch_size, progress=True).numpy()
    out = Path(args.output)
    with atomic_path(out) as tmp, open(tmp, "wb") as f:  # a path without .npy: np.save adds it
        np.save(f, vectors)
    if args.jsonl:
        with atomic_path(args.jsonl) as tmp, open(tmp, "w", encoding="utf-8") as f:
            for text, v in zip(texts, vectors.tolist(), strict=True):
                f.write(json.dumps({"text": text, "embedding": v}, ensure_ascii=False) + "\n")
    print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} embeddings ({pooling}) to {out}")
