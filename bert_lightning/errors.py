"""User mistakes (bad data, bad config values, missing files, the wrong kind of checkpoint) are
`UserError`s, whose message is the whole story: the file (line, column, key) and what was
expected. Every entry point runs under `reported`, which prints such an error as one line and
exits 2; anything else is a bug and keeps its traceback.

Standard library only: it sits at the bottom of the package, so that every layer raises it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_CODE = 2  # as argparse's usage errors


class UserError(ValueError):
    """A mistake the user can fix from the message alone (a ValueError, as bad values are).
    `exit_code`: what the process exits with when it is reported, `label` what its line
    starts with."""

    exit_code = EXIT_CODE
    label = "error"


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder that was named but is not there."""


def user_error(exc: BaseException | None) -> UserError | None:
    """The UserError behind `exc`: Hydra's instantiate, `datasets` and Lightning re-raise
    errors wrapped (`raise ... from e`), so the chain of causes and contexts is walked."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, UserError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def first_line(exc: BaseException) -> str:
    """An exception's message cut to its first line (a marker file, a wrapped error)."""
    return (str(exc).strip().splitlines() or [""])[0]


@contextmanager
def reported(debug: bool = False) -> Iterator[None]:
    """A UserError raised inside becomes `<label>: <message>` on stderr (`error: ...`) and its
    exit code (2); `debug` (or any other exception) keeps the traceback."""
    try:
        yield
    except Exception as e:
        err = None if debug else user_error(e)
        if err is None:
            raise
        # one write: the ranks of a run share stderr, and a line written in pieces interleaves
        sys.stderr.write(f"{err.label}: {err}\n")
        sys.stderr.flush()
        raise SystemExit(err.exit_code) from None
