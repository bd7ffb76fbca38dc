"""`bert-lightning index MODEL CATALOGUE OUT`: every ad of a catalogue encoded once by a fine-tuned
bi-encoder, for `score --index` and `serve --index` to rank from (bert_lightning/catalogue.py),
by Lightning's predict loop (`--devices N`: shared by N processes, DDP).
An index that exists is compared with the catalogue instead: up to date, or the ids added,
removed or edited since (or another encoder) in one line; `--overwrite` builds it again."""

from __future__ import annotations

from pathlib import Path

from bert_lightning.choices import EF_SEARCH, SCORE_BATCH
from bert_lightning.commands.options import (
    add_column_argument,
    add_table_arguments,
    at_least_one,
    columns,
)
from bert_lightning.errors import UserError

KEYS = {"id": "id", "ad": "ad"}  # --column KEY: its default column name


def read_catalogue(path: str, named: dict[str, str], **table) -> tuple[list[str], list[str]]:
    """The ids (as text) and ads of a catalogue table; `named`: `--column` KEY -> NAME."""
    from bert_lightning.data.tables import column, read_table, text_values

    rows = read_table(path, table.pop("format", None), **table)
    names = KEYS | named
    ids, ads = (
        text_values(column(rows, names[k], path, f"{k}_column"), path, names[k]) for k in KEYS
    )
    return ids, ads


def register(sub) -> None:
    p = sub.add_parser(
        "index",
        help="encode a catalogue's ads once with a fine-tuned bi-encoder (score/serve --index)",
    )
    p.add_argument("model", help="a fine-tuned bi-encoder: its .ckpt or export-hf folder")
    p.add_argument("catalogue", help="CSV/TSV/JSONL/Parquet with an id and an ad column")
    p.add_argument("out", help="the index folder to write")
    add_table_arguments(p)
    add_column_argument(p, "id, ad; default: id, ad")
    p.add_argument("--batch-size", type=at_least_one, default=SCORE_BATCH)
    p.add_argument(
        "--devices",
        type=int,
        default=1,
        help="processes that share the ads (DDP; -1: every GPU), by Lightning's predict loop",
    )
    p.add_argument("--accelerator", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument(
        "--hnsw",
        type=int,
        default=0,
        metavar="M",
        help="search by an HNSW graph of M links per ad (e.g. 32; large catalogues) rather than "
        "exactly",
    )
    p.add_argument(
        "--ef-search", type=int, help=f"HNSW's breadth of search (with --hnsw; {EF_SEARCH})"
    )
    p.add_argument("--overwrite", action="store_true", help="build OUT again if it exists")
    p.set_defaults(func=_main)


def _main(args) -> None:
    from bert_lightning.catalogue import (
        bi_encoder,
        catalogue_changes,
        changes_line,
        check_catalogue,
        check_encoder,
        read_index,
        search_settings,
        write_index,
    )
    from bert_lightning.commands.options import table_options
    from bert_lightning.inference import load_finetuned

    if args.ef_search is not None and not args.hnsw:
        raise UserError(f"--ef-search {args.ef_search}: an HNSW graph's; give --hnsw M too")
    ef_search = (EF_SEARCH if args.ef_search is None else args.ef_search) if args.hnsw else 0
    if why := search_settings(args.hnsw, ef_search):
        raise UserError(why)
    named = columns(args.column, list(KEYS), "the catalogue's columns")
    ids, ads = read_catalogue(args.catalogue, named, **table_options(args))
    ft = load_finetuned(args.model, "bert-lightning index")
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        index = read_index(out)
        check_encoder(index, ft, args.model)
        said = changes_line(catalogue_changes(index, ids, ads))
        was = (index.record["hnsw_m"], index.record["ef_search"])
        if said is None and was != (args.hnsw, ef_search):
            how = f"--hnsw {was[0]} --ef-search {was[1]}" if was[0] else "exact search"
            raise UserError(f"{out}: built for {how}, not as asked; --overwrite rebuilds it")
        if said is None:
            print(f"{out}: up to date with {args.catalogue} ({len(ids)} ads)")
            return
        raise UserError(f"{out}: {args.catalogue} changed since: {said}; --overwrite rebuilds it")
    check_catalogue(ids, ads, args.catalogue)
    from bert_lightning.training.predict import predicted_vectors

    hardware = {"accelerator": args.accelerator, "devices": args.devices}
    if args.devices != 1:
        hardware["strategy"] = "ddp"
    vectors = predicted_vectors(
        bi_encoder(ft, args.model), ft.tokenizer(), ads, args.batch_size, True, **hardware
    )
    if vectors is None:  # a process of rank > 0: rank 0 writes the index
        return
    write_index(ft, args.model, ids, ads, vectors, out, args.hnsw, ef_search)
    print(f"wrote {out}: {len(ids)} ads")
