"""Command-line options several commands share, one way for all: a table read as the
fine-tuned model's task read its files (`score`, `evaluate`; `embed`: as a table is read by
default), unless the options say otherwise, its columns (`--column KEY=NAME`) and grades
(`evaluate`). Not a command."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

from bert_lightning.errors import UserError

TABLE_HELP = "default: as the model's task read its files (else by extension / utf-8 / a header)"


def at_least_one(text: str) -> int:
    """An argparse type: a count or a length (`--batch-size`, `--max-seq-length`), >= 1;
    argparse names the option in its one line."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return n


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


def add_column_argument(p, keys: str) -> None:
    """`--column KEY=NAME`, repeatable: the file's column NAME read as the KEY column (`keys`:
    which there are, and the default)."""
    p.add_argument(
        "--column",
        action="append",
        default=[],
        metavar="KEY=NAME",
        help=f"read the KEY column from the file's column NAME, repeatable (KEY: {keys})",
    )


@contextmanager
def missing_columns_named_by_option(args) -> Iterator[None]:
    """A command with `--column` names it as the fix of a missing column (`--column
    query=NAME`), where fine-tuning names the task key (`task.query_column=NAME`)."""
    try:
        yield
    except UserError as e:
        if not (hasattr(args, "column") and hasattr(e, "fixed_by")):  # data.tables.MissingColumn
            raise
        key = e.key.removesuffix("_column")
        raise e.fixed_by(f"--column {key}=NAME reads another") from None


def columns(given: list[str], known: list[str], whose: str) -> dict[str, str]:
    """{KEY: NAME} of the `--column KEY=NAME` options given, each KEY one of `known`."""
    out = {}
    for column in given:
        key, sep, name = column.partition("=")
        if not sep or not name or key not in known:
            raise UserError(
                f"--column {column}: expected KEY=NAME with KEY one of {', '.join(known)} ({whose})"
            )
        out[key] = name
    return out


NOT_SCORED = ("label", "group", "clicks", "impressions")  # columns a score reads none of


def column_options(given: list[str], task, scored_only: bool = False) -> dict:
    """The task config keys (`query_column`, ...) of the `--column` options: a file whose
    columns are named otherwise than the one the model was fine-tuned on. `scored_only`: the
    columns of the texts alone (`score`), not those that label or group them."""
    known = [k.removesuffix("_column") for k in asdict(task.cfg) if k.endswith("_column")]
    known = [k for k in known if not (scored_only and k in NOT_SCORED)]
    named = columns(given, known, f"the columns of its {task.cfg.kind} task")
    return {f"{key}_column": name for key, name in named.items()}


def task_options(args, task) -> dict:
    """The task config keys `--column` and `--grades` give: a file labelled or named otherwise
    than the one the model was fine-tuned on."""
    keys, out = asdict(task.cfg), column_options(args.column, task)
    if args.grades:
        if keys.get("label_type") != "graded":
            raise UserError(f"--grades: the model's {task.cfg.kind} task reads no graded labels")
        low, _, high = args.grades.partition(",")
        try:
            out |= {"grade_min": float(low), "grade_max": float(high)}
        except ValueError:
            raise UserError(f"--grades {args.grades}: expected MIN,MAX, two numbers") from None
    return out
