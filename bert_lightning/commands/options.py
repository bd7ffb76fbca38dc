"""Command-line options several commands share, one way for all: a table read as the
fine-tuned model's task read its files (`score`, `evaluate`; `embed`: as a table is read by
default), unless the options say otherwise, its columns (`--column KEY=NAME`) and grades
(`evaluate`). Not a command."""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict
from functools import partial

from bert_lightning.errors import UserError

log = logging.getLogger(__name__)
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


def add_column_argument(
    p, keys: str, renamed: dict[str, str] | None = None, bare: str | None = None
) -> None:
    """`--column KEY=NAME`, repeatable: the file's column NAME read as the KEY column (`keys`:
    which there are, and the default). `renamed`: old options (`--query-column NAME`) and the
    key each gives, `bare`: the key of an old `--column NAME`; both work for one release more,
    with a warning."""
    p.add_argument(
        "--column",
        action="append",
        default=[],
        type=partial(_column, bare),
        metavar="KEY=NAME",
        help=f"read the KEY column from the file's column NAME, repeatable (KEY: {keys})",
    )
    for old, key in (renamed or {}).items():
        p.add_argument(
            old,
            dest="column",
            action="append",
            type=partial(_renamed, old, key),
            metavar="NAME",
            help=f"deprecated: --column {key}=NAME",
        )


def _column(bare: str | None, given: str) -> str:
    """`--column` as given, or for an old bare `--column NAME` its `bare` key's."""
    if bare and "=" not in given:
        return _renamed("--column", bare, given)
    return given


def _renamed(old: str, key: str, name: str) -> str:
    """`--column KEY=NAME` for an old spelling, which warns in one line naming the new one."""
    log.warning(
        "%s %s is deprecated (removed in the next release); use --column %s=%s",
        old,
        name,
        key,
        name,
    )
    return f"{key}={name}"


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


def column_options(given: list[str], task) -> dict:
    """The task config keys (`query_column`, ...) of the `--column` options: a file whose
    columns are named otherwise than the one the model was fine-tuned on."""
    known = [k.removesuffix("_column") for k in asdict(task.cfg) if k.endswith("_column")]
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
