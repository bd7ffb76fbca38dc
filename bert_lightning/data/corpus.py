"""Reading documents: C4-style JSON lines (`.json`, `.jsonl`) or plain text (`.txt`: one document
per blank-line-separated block, or per line), optionally `.gz`; bad input is either named
precisely in an error or skipped and counted. A document over the length limit is bad input, or
is split into pieces (`long_docs`)."""

from __future__ import annotations

import glob
import gzip
import json
import logging
import zlib
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.shipped import group_defaults

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".txt.gz")
SUFFIXES = (".json", ".jsonl", ".json.gz", ".jsonl.gz", *TEXT_SUFFIXES)
ON_BAD_RECORD = ("error", "skip")
TEXT_UNITS = ("block", "line")  # plain text: a document per blank-line-separated block or line
LONG_DOCS = ("error", "split")  # a document over max_chars: a bad record | cut into pieces
BREAKS = ("\n\n", "\n", " ")  # where `split_document` cuts, the first found before the limit


class BadRecordError(UserError):
    """A record or file that cannot be read; the message names file, line (and column)."""


class _Bad(ValueError):
    """What is wrong with one record; `column` (1-based) when the parser knows it, `line` the
    line within the record (a block of plain text spans several)."""

    def __init__(self, message: str, column: int | None = None, line: int = 0):
        super().__init__(message)
        self.column, self.line = column, line


def resolve_files(spec: str | Sequence[str]) -> list[str]:
    """A file, a folder (its JSON-lines files) or a glob, or a list of those -> sorted paths."""
    specs = [spec] if isinstance(spec, str | Path) else list(spec)
    files: list[str] = []
    for s in map(str, specs):
        p = Path(s)
        if p.is_file():
            files.append(s)
        elif p.is_dir():
            found = sorted(str(f) for f in p.iterdir() if f.name.endswith(SUFFIXES))
            if not found:
                raise MissingFileError(f"{s}: folder holds no {'/'.join(SUFFIXES)} files")
            files += found
        elif glob.has_magic(s):
            found = sorted(glob.glob(s))
            if not found:
                raise MissingFileError(f"{s}: no file matches this pattern")
            files += found
        else:
            raise MissingFileError(f"{s}: no such file or folder")
    if not files:
        raise MissingFileError(f"no input files given ({spec!r})")
    return files


@dataclass
class BadRecords:
    """What `skip` mode passed over: a count and where the first few were."""

    count: int = 0
    first: list[str] = field(default_factory=list)

    def add(self, where: str) -> None:
        self.count += 1
        if len(self.first) < 5:
            self.first.append(where)
            log.warning("skipping bad record: %s", where)

    def summary(self, read: int) -> str:
        return (
            f"read {read} documents, skipped {self.count} bad record(s); "
            f"first: {'; '.join(self.first)}"
        )


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:  # the byte is counted from the start of its line
        line, byte = raw.count(b"\n", 0, e.start), e.start - raw.rfind(b"\n", 0, e.start) - 1
        raise _Bad(f"invalid UTF-8 ({e.reason} at byte {byte})", line=line) from None


def _check(text: str) -> str:
    if not text.strip():
        raise ValueError("empty document")
    return text


def split_document(text: str, max_chars: int) -> list[str]:
    """`text` cut into pieces of at most `max_chars` characters, each at the last paragraph
    break before the limit, else the last newline, else the last space, else hard at the limit
    (a book stays readable text, cut where its own structure allows); pieces are stripped and
    empty ones dropped."""
    pieces, start = [], 0
    while len(text) - start > max_chars:
        end = start + max_chars
        found = (text.rfind(sep, start + 1, end + len(sep)) for sep in BREAKS)
        cut = next((i for i in found if i > start), end)
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return [p for p in map(str.strip, pieces) if p]


def _fit(text: str, max_chars: int | None, long_docs: str) -> list[str]:
    """A document within `max_chars`, as one or (`long_docs=split`) several documents."""
    if max_chars is None or len(text) <= max_chars:
        return [text]
    if long_docs == "split":
        return split_document(text, max_chars)
    raise ValueError(f"document of {len(text):,} characters, over max_doc_chars={max_chars:,}")


def _parse(raw: bytes) -> str:
    """One JSON line -> its non-empty `text`, or a ValueError saying what is wrong."""
    line = _decode(raw)
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:  # e.msg alone stops short ("Invalid control character at")
        msg = e.msg.removesuffix(" at")  # "Invalid control character at", "... starting at"
        raise _Bad(f"invalid JSON ({msg} at column {e.colno})", e.colno) from None
    except (ValueError, RecursionError) as e:  # a number over 4,300 digits; nested too deep
        raise ValueError(f"invalid JSON ({e})") from None
    if not isinstance(record, dict) or "text" not in record:
        raise ValueError("no 'text' field")
    text = record["text"]
    if not isinstance(text, str):
        raise ValueError(f"'text' is {type(text).__name__}, expected a string")
    try:  # JSON may escape a lone surrogate ("\\ud800"): no tokenizer takes it
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"'text' holds a lone surrogate {text[e.start]!r} at character {e.start + 1}"
        ) from None
    return _check(text)


def _parse_text(raw: bytes) -> str:
    return _check(_decode(raw).strip())


def _records(f, path: str, text_unit: str) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each record of an open file; blank lines are not records."""
    if text_unit == "line" or not path.endswith(TEXT_SUFFIXES):
        for lineno, raw in enumerate(f, start=1):
            if raw.strip():
                yield lineno, raw
        return
    block: list[bytes] = []
    first = 0
    for lineno, raw in enumerate(f, start=1):
        if raw.strip():
            first = first if block else lineno
            block.append(raw)
        elif block:
            yield first, b"".join(block)
            block = []
    if block:
        yield first, b"".join(block)


# how a run reads its files (conf/data/_corpus.yaml), and so a reader outside one (tests, tools)
READ = group_defaults("data", "_corpus")


def iter_documents(files: Sequence[str], *args, **read) -> Iterator[str]:
    """The `text` of every good record (`numbered_documents` without the numbers)."""
    return (text for _, _, text in numbered_documents(files, *args, **read))


def numbered_documents(
    files: Sequence[str],
    on_bad_record: str = READ["on_bad_record"],
    bad: BadRecords | None = None,
    max_chars: int | None = READ["max_doc_chars"],
    text_unit: str = READ["text_unit"],
    long_docs: str = READ["long_docs"],
) -> Iterator[tuple[int, int, str]]:
    """(index of its file in `files`, its number in the file, text) of every good record; other
    fields are ignored. Blank lines are not records. A corrupt or truncated `.gz` ends that file
    (skip) or raises (error). A document over `max_chars` is a bad record (`long_docs=error`: a
    stray multi-MB page would stall the sentence splitter and hold a worker's memory; C4
    documents are rarely over 100,000 characters), or (`split`: books) is cut by
    `split_document`, each piece a document of its own that keeps the whole one's number, so
    that a held-out split takes whole documents (`pipeline.hold_out`)."""
    if on_bad_record not in ON_BAD_RECORD:
        raise UserError(f"data.on_bad_record={on_bad_record!r}; expected one of {ON_BAD_RECORD}")
    if text_unit not in TEXT_UNITS:
        raise UserError(f"data.text_unit={text_unit!r}; expected one of {TEXT_UNITS}")
    if long_docs not in LONG_DOCS:
        raise UserError(f"data.long_docs={long_docs!r}; expected one of {LONG_DOCS}")
    bad = bad if bad is not None else BadRecords()

    def reject(where: str) -> None:
        if on_bad_record == "error":
            raise BadRecordError(f"{where}; data.on_bad_record=skip skips such records")
        bad.add(where)

    read = 0
    for index, path in enumerate(files):
        number = 0
        lineno = 0
        parse = _parse_text if path.endswith(TEXT_SUFFIXES) else _parse
        try:
            with _open(path) as f:
                for lineno, raw in _records(f, path, text_unit):  # noqa: B007 (read in except)
                    try:
                        texts = _fit(parse(raw), max_chars, long_docs)
                    except ValueError as e:
                        col = f"{e.column}:" if isinstance(e, _Bad) and e.column else ""
                        line = lineno + e.line if isinstance(e, _Bad) else lineno
                        reject(f"{path}:{line}:{col} {e}")
                        continue
                    read += len(texts)
                    yield from ((index, number, text) for text in texts)
                    number += 1
        except (OSError, EOFError, zlib.error) as e:
            reject(f"{path}: unreadable after line {lineno}: {e}")
    if bad.count:
        log.warning(bad.summary(read))


def interleave_documents(files: Sequence[str], **read) -> Iterator[str]:
    """The documents of `files` round-robin: the first of each file, then the second of each,
    ...; a file that ends drops out. What a tokenizer trains on is the first documents of a
    stream, and read file after file they would all come from the first source listed.
    `read`: the options of `iter_documents`."""
    streams = deque(iter_documents([f], **read) for f in files)
    while streams:
        stream = streams.popleft()
        text = next(stream, None)
        if text is not None:
            yield text
            streams.append(stream)
