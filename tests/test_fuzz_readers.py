"""Fuzzed readers: whatever bytes a corpus, table, CoNLL or vocabulary file holds, its
reader either parses them or raises a one-line `UserError` that names the file (and the line,
where the input has lines). Any other exception reaches the user as a traceback, a message over
several lines breaks the `error: ...` line, and a hang stalls a run. Beside random bytes, the
strategies write well-formed files with one malformed record at a known line, so the line the
error names is checked too. Examples are derandomized and no example database is kept, so CI runs
the same cases every time."""

import csv
import gzip
import io
import json
import math
import signal
import tempfile
import zipfile
from contextlib import contextmanager

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from bert_lightning.data.corpus import BadRecordError, BadRecords, iter_documents
from bert_lightning.data.tables import (
    float_values,
    label_values,
    read_conll,
    read_table,
    text_values,
)
from bert_lightning.data.tokenizer import (
    SPECIAL_TOKENS,
    load_tokenizer,
    load_vocab_txt,
    symbol_tokenizer,
)
from bert_lightning.errors import UserError

# hypothesis caches what it learns of the source beside the examples, in ./.hypothesis: keep the
# tree clean (the folder goes when the run ends)
_HOME = tempfile.TemporaryDirectory(prefix="hypothesis-")
set_hypothesis_home_dir(_HOME.name)
FUZZ = settings(
    max_examples=40,
    deadline=None,  # a slow CI core is not a failure; `no_hang` bounds every read instead
    derandomize=True,
    database=None,  # no .hypothesis folder in the tree
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def chars(excluded: str):
    """Characters but surrogates and `excluded` (text's default alphabet, a UTF-8 codec, takes
    seconds to compute on every run, as its cache would be in .hypothesis)."""
    return st.characters(exclude_categories=["Cs"], exclude_characters=excluded)


# text that survives a round trip through UTF-8 (no lone surrogates) and holds no line break
WORD = st.text(chars("\n\r"), min_size=1, max_size=12)
WORD = WORD.filter(str.strip)
BAD_UTF8 = st.sampled_from([b"\xff", b"\xfe\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\x80"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(chars(""), max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(chars(""), max_size=5), inner)
    ),
    max_leaves=8,
)


class Hang(BaseException):
    """Not an Exception: a reader's `except OSError` must not turn the alarm into a bad record."""


@contextmanager
def no_hang(seconds: int = 10):
    def alarm(*_):
        raise Hang(f"a reader ran for over {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome(read, path):
    """`read()`'s result, or the message of the one-line UserError naming `path` it raised.
    Any other exception fails the test (hypothesis then shows the bytes)."""
    with no_hang():
        try:
            return read(), None
        except UserError as e:
            message = str(e)
    assert message.splitlines() == [message], f"not one line: {message!r}"
    assert message.startswith(str(path)), message
    return None, message


def fails_at(read, path, where: str) -> str:
    """The message of the one-line UserError `read()` must raise; it starts with `where`."""
    result, message = outcome(read, path)
    assert message is not None, f"read without an error: {result!r}"
    assert message.startswith(where), f"{message!r} does not start with {where!r}"
    return message


def with_bad_bytes(line: str, bad: bytes, at: int) -> bytes:
    """`line` in UTF-8 with `bad` put between two characters (never inside one)."""
    at = min(at, len(line))
    return line[:at].encode() + bad + line[at:].encode()


def fresh(path, data: bytes):
    """Write `data` to `path`, compressed as the suffix says."""
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.name.endswith(".zip"):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(path.name.removesuffix(".zip"), data)
        data = buf.getvalue()
    path.write_bytes(data)
    return path


# ---------------------------------------------------------------- corpus (pretraining text)


def corpus_bytes():
    """Random bytes, or lines mixing JSON records, JSON values, text and random bytes."""
    line = st.one_of(
        st.builds(lambda t: json.dumps({"text": t}).encode(), st.text(chars(""), max_size=20)),
        st.builds(lambda v: json.dumps(v).encode(), JSON),
        st.text(chars(""), max_size=20).map(str.encode),
        st.binary(max_size=20),
    )
    return st.binary(max_size=600) | st.lists(line, max_size=12).map(b"\n".join)


@FUZZ
@given(
    data=corpus_bytes(),
    suffix=st.sampled_from([".jsonl", ".json", ".txt", ".jsonl.gz", ".txt.gz"]),
    text_unit=st.sampled_from(["block", "line"]),
    gz=st.sampled_from(["compressed", "raw", "truncated"]),
)
def test_corpus_any_bytes(tmp_path, data, suffix, text_unit, gz):
    """`.gz` shards hold the bytes compressed, cut short, or not compressed at all."""
    path = tmp_path / f"shard{suffix}"
    if suffix.endswith(".gz") and gz != "raw":
        packed = gzip.compress(data, mtime=0)
        data = packed if gz == "compressed" else packed[: len(packed) // 2]
    path.write_bytes(data)
    docs, message = outcome(lambda: list(iter_documents([str(path)], text_unit=text_unit)), path)
    bad = BadRecords()
    with no_hang():  # skip mode never raises: what it cannot read, it counts
        kept = list(iter_documents([str(path)], "skip", bad, text_unit=text_unit))
    for doc in kept:  # a document the tokenizer can take: non-blank, encodable text
        assert isinstance(doc, str) and doc.strip()
        doc.encode("utf-8")
    if message is None:
        assert kept == docs and bad.count == 0
    else:
        assert bad.count >= 1 and message.startswith(bad.first[0])


def truncated(line: str):
    return st.integers(1, len(line) - 1).map(lambda n: line[:n])


GOOD_RECORD = st.builds(lambda t: json.dumps({"text": t, "url": "u"}), WORD)
BROKEN_JSON = st.one_of(  # no reader takes these lines
    GOOD_RECORD.flatmap(truncated),  # a cut record: never valid JSON
    st.integers(2_000, 60_000).map(lambda n: "[" * n),  # nested past the recursion limit
    st.integers(4_301, 6_000).map(lambda n: '{"text": ' + "7" * n + "}"),  # int digits cap
    st.sampled_from(["{", "}", "nan", "{'text': 'x'}", '{"text": "a" "b"}', "\x00", "\ufeff{}"]),
).map(str.encode) | st.tuples(GOOD_RECORD, BAD_UTF8, st.integers(0, 40)).map(
    lambda g: with_bad_bytes(*g)
)
BAD_RECORD = BROKEN_JSON | st.one_of(  # JSON, but not a C4 record with text
    JSON.filter(lambda v: not isinstance(v, dict)).map(json.dumps),
    st.dictionaries(st.text(chars(""), max_size=5).filter(lambda k: k != "text"), JSON).map(
        json.dumps
    ),
    JSON.filter(lambda v: not isinstance(v, str)).map(lambda v: json.dumps({"text": v})),
    st.sampled_from(["", " ", "\t\n "]).map(lambda t: json.dumps({"text": t})),
    st.sampled_from(['{"text": "a\\ud800b"}', '{"text": "\\udfff"}']),  # lone surrogates
).map(str.encode)


@FUZZ
@given(
    texts=st.lists(WORD, max_size=6),
    blank=st.lists(st.booleans(), min_size=7, max_size=7),
    at=st.integers(0, 6),
    bad=BAD_RECORD,
    gz=st.booleans(),
)
def test_corpus_bad_json_line_is_named(tmp_path, texts, blank, at, bad, gz):
    """One malformed record among good ones, blank lines between some: named by its line (skip
    mode: counted, the rest read)."""
    at = min(at, len(texts))
    lines = [json.dumps({"text": t}).encode() for t in texts]
    lines.insert(at, bad)
    data, line_of_bad = b"", 0
    for i, line in enumerate(lines):
        data += b"\n" if blank[i] else b""  # blank lines are not records, but they count
        data += line + b"\n"
        line_of_bad = data.count(b"\n") if i == at else line_of_bad
    path = fresh(tmp_path / ("c4.json.gz" if gz else "c4.jsonl"), data)
    fails_at(lambda: list(iter_documents([str(path)])), path, f"{path}:{line_of_bad}:")
    with pytest.raises(BadRecordError):  # the corpus's own kind of UserError
        list(iter_documents([str(path)]))
    bad_records = BadRecords()
    assert list(iter_documents([str(path)], "skip", bad_records)) == texts
    assert bad_records.count == 1 and bad_records.first[0].startswith(f"{path}:{line_of_bad}:")


@FUZZ
@given(
    blocks=st.lists(st.lists(WORD, min_size=1, max_size=3), min_size=1, max_size=5),
    which=st.integers(0, 20),
    bad=BAD_UTF8,
    at=st.integers(0, 20),
    text_unit=st.sampled_from(["block", "line"]),
)
def test_plain_text_bad_bytes_name_their_line(tmp_path, blocks, which, bad, at, text_unit):
    """Non-UTF-8 bytes in a line of a multi-line block: the error names that line."""
    lines = [line for block in blocks for line in [*block, ""]]
    which = which % len(lines)
    assume(lines[which])
    data = b"".join(
        with_bad_bytes(line, bad, at) + b"\n" if i == which else line.encode() + b"\n"
        for i, line in enumerate(lines)
    )
    path = fresh(tmp_path / "books.txt", data)
    fails_at(
        lambda: list(iter_documents([str(path)], text_unit=text_unit)),
        path,
        f"{path}:{which + 1}:",
    )


# ---------------------------------------------------------------- tables (fine-tuning data)


def check_typed_columns(df, path):
    """Every column through every typed helper: a list of the right type, or a named error."""
    for name in df.columns:
        values = df[name].tolist()
        texts, _ = outcome(lambda v=values, n=name: text_values(v, path, n), path)
        if texts is not None:
            for t in texts:
                assert isinstance(t, str)
                t.encode("utf-8")  # the tokenizer takes it
        floats, _ = outcome(lambda v=values, n=name: float_values(v, path, n), path)
        assert floats is None or all(math.isfinite(x) for x in floats)
        ids, _ = outcome(lambda v=values, n=name: label_values(v, ["0", "1"], path, n), path)
        assert ids is None or set(ids) <= {0, 1}


def table_bytes():
    """Random bytes, or lines of cells (quotes, blanks, numbers) joined by commas or tabs, or
    JSON lines, or Latin-1 noise."""
    cell = st.text(chars(""), max_size=6) | st.sampled_from(
        ['"', '""', "nan", "1e999", "-0", " ", "0", "1"]
    )
    row = st.lists(cell, max_size=4).flatmap(
        lambda c: st.sampled_from([",", "\t"]).map(lambda s: s.join(c))
    )
    noise = st.binary(max_size=12).map(lambda b: b.decode("latin-1"))
    line = row | st.builds(json.dumps, JSON) | noise
    lines = st.lists(line, max_size=10).map(lambda ls: "\n".join(ls).encode("utf-8", "replace"))
    return st.binary(max_size=400) | lines


@settings(FUZZ, max_examples=80)
@given(
    data=table_bytes(),
    suffix=st.sampled_from([".csv", ".tsv", ".jsonl", ".csv.gz", ".tsv.zip", ".parquet"]),
    header=st.booleans(),
    compress=st.booleans(),
)
def test_table_any_bytes(tmp_path, data, suffix, header, compress):
    """Compressed suffixes get either compressed bytes or raw ones (a corrupt archive)."""
    path = tmp_path / f"train{suffix}"
    if compress:
        fresh(path, data)
    else:
        path.write_bytes(data)
    df, _ = outcome(lambda: read_table(path, header=header), path)
    if df is not None:
        assert isinstance(df, pd.DataFrame) and len(df) > 0
        check_typed_columns(df, path)


CELL = st.text(chars(""), max_size=8)
TSV_CELL = st.text(chars("\t\n\r"), max_size=8)


def csv_line(row: list[str], sep: str) -> str:
    """A row as csv.writer writes it (quoted where it must be: a quoted cell may hold line
    breaks; CRLF ends it, so that a lone CR is quoted too), or joined by tabs (TSV, no quotes)."""
    if sep == "\t":
        return "\t".join(row) + "\n"
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\r\n").writerow(row)
    return buf.getvalue()


def line_breaks(text: str) -> int:
    """Line breaks as editors (and Python's universal newlines) count them: LF, CR, CRLF."""
    return text.count("\n") + text.count("\r") - text.count("\r\n")


def blank(row: list[str]) -> bool:
    """A row that is an empty or whitespace-only line, which CSV readers (pandas too) skip."""
    return len(row) == 1 and not row[0].strip() and row[0] != ""


@settings(FUZZ, max_examples=60)
@given(width=st.integers(1, 4), sep=st.sampled_from([",", "\t"]), data=st.data())
def test_table_round_trip(tmp_path, width, sep, data):
    """Well-formed CSV/TSV: every cell comes back as written, a string (quotes, commas and line
    breaks in CSV cells included); the first row names the columns."""
    cell = CELL if sep == "," else TSV_CELL
    rows = data.draw(st.lists(st.lists(cell, min_size=width, max_size=width), max_size=6))
    rows = [r for r in rows if not blank(r) and not (sep == "\t" and r == [""])]
    header = [f"col{i}" for i in range(width)]
    path = tmp_path / ("t.csv" if sep == "," else "t.tsv")
    path.write_bytes("".join(csv_line(r, sep) for r in [header, *rows]).encode())
    df, message = outcome(lambda: read_table(path), path)
    if not rows:
        assert message == f"{path}: empty file (no data rows)"
        return
    assert message is None, message
    assert list(df.columns) == header
    assert df.values.tolist() == rows


@settings(FUZZ, max_examples=80)
@given(
    width=st.integers(1, 4),
    sep=st.sampled_from([",", "\t"]),
    kind=st.sampled_from(["long", "short", "bytes", "quote"]),
    data=st.data(),
)
def test_table_bad_row_is_named_by_line(tmp_path, width, sep, kind, data):
    """A row with too many or too few fields (pandas pads a short row with empty cells, and
    takes a long first row's extra field for an index, shifting every column), non-UTF-8
    bytes or (CSV) a quote never closed: the error names the line the row starts on, counting
    the line breaks inside quoted cells before it."""
    assume(not (kind == "short" and width == 1) and not (kind == "quote" and sep == "\t"))
    cell = (CELL if sep == "," else TSV_CELL).filter(str.strip)
    cells = lambda n: data.draw(st.lists(cell, min_size=n, max_size=n))
    rows = data.draw(st.lists(st.lists(cell, min_size=width, max_size=width), max_size=5))
    at = len(rows) if kind == "quote" else data.draw(st.integers(0, len(rows)))
    lines = [csv_line(r, sep) for r in [[f"col{i}" for i in range(width)], *rows]]
    line_no = 1 + sum(line_breaks(line) for line in lines[: at + 1])
    if kind == "long":
        bad = csv_line(cells(width + data.draw(st.integers(1, 3))), sep).encode()
    elif kind == "short":
        bad = csv_line(cells(data.draw(st.integers(1, width - 1))), sep).encode()
    elif kind == "bytes":
        row = csv_line(cells(width), sep)
        i = data.draw(st.integers(0, len(row) - 1))
        assume(row[i - 1 : i + 1] != "\r\n")  # between CR and LF, the bytes would split a break
        bad = with_bad_bytes(row, data.draw(BAD_UTF8), i)
        line_no += line_breaks(row[:i])
    else:  # the last row: a quote that runs to the end of the file
        bad = csv_line(cells(width - 1), sep).removesuffix("\r\n")
        bad = (bad + ("," if width > 1 else "") + '"never closed\n').encode()
    body = [line.encode() for line in lines]
    body.insert(at + 1, bad)
    path = fresh(tmp_path / ("t.csv" if sep == "," else "t.tsv"), b"".join(body))
    fails_at(lambda: read_table(path), path, f"{path}: line {line_no}:")


@FUZZ
@given(
    rows=st.lists(st.dictionaries(WORD, JSON, min_size=1, max_size=3), max_size=5),
    blanks=st.lists(st.booleans(), min_size=6, max_size=6),
    at=st.integers(0, 5),
    bad=BROKEN_JSON
    | JSON.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
)
def test_jsonl_table_bad_line_is_named(tmp_path, rows, blanks, at, bad):
    """Broken JSON (cut, nested too deep, a 4,301-digit number, non-UTF-8) or a line that is not
    an object, among good rows and blank lines: named by its line."""
    at = min(at, len(rows))
    lines = [json.dumps(r).encode() for r in rows]
    lines.insert(at, bad)
    data, line_no = b"", 0
    for i, line in enumerate(lines):
        data += b"\n" if blanks[i] else b""
        data += line + b"\n"
        line_no = data.count(b"\n") if i == at else line_no
    path = fresh(tmp_path / "rows.jsonl", data)
    fails_at(lambda: read_table(path), path, f"{path}:{line_no}:")


@FUZZ
@given(
    good=st.lists(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-9, 9)),
    at=st.integers(0, 20),
    bad=st.sampled_from(
        [None, math.nan, math.inf, "", "x", "1,5", [1], {"a": 1}, 10**400, "1e999", "nan"]
    ),
)
def test_float_values_name_the_bad_row(good, at, bad):
    """Numbers come back as floats; a missing, non-numeric or non-finite value (an int past
    1e308 too) is named by its row."""
    at = min(at, len(good))
    values = [*good[:at], bad, *good[at:]]
    message = fails_at(lambda: float_values(values, "t.csv", "y"), "t.csv", "t.csv: row ")
    assert message.startswith(f"t.csv: row {at + 1}, column 'y':"), message
    assert float_values(good, "t.csv", "y") == [float(v) for v in good]


def missing_or_surrogate(v) -> bool:
    if isinstance(v, str):
        return any(0xD800 <= ord(c) <= 0xDFFF for c in v)
    return v is None or (isinstance(v, float) and math.isnan(v))


@FUZZ
@given(
    values=st.lists(JSON | WORD, max_size=8),
    labels=st.lists(WORD, min_size=1, max_size=3, unique=True),
    at=st.integers(0, 8),
    bad=st.sampled_from([None, math.nan, "a\ud800", "\udfff"]),
)
def test_text_and_label_values(values, labels, at, bad):
    """Text: a str the tokenizer takes, for any value but a missing one or a lone surrogate (valid
    JSON, yet no tokenizer input), named by row. Labels: the index in the label set (a value's
    surrounding spaces aside, an integral float as its integer), or the first row whose value
    is missing or blank (a bad row, never a class), a boolean among numbers, or not in it."""
    texts, message = outcome(lambda: text_values(values, "t.jsonl", "text"), "t.jsonl")
    assert message is not None or texts == [str(v) for v in values]
    at = min(at, len(values))
    with_bad = [*values[:at], bad, *values[at:]]
    message = fails_at(lambda: text_values(with_bad, "t.jsonl", "text"), "t.jsonl", "t.jsonl: ")
    first = next(i for i, v in enumerate(with_bad) if missing_or_surrogate(v))
    assert message.startswith(f"t.jsonl: row {first + 1}, column 'text':"), message
    ids, message = outcome(lambda: label_values(values, labels, "t.jsonl", "label"), "t.jsonl")
    numbers = any(type(v) in (int, float) and not missing_or_surrogate(v) for v in values)

    def key(v):
        if missing_or_surrogate(v) and not isinstance(v, str):
            return ""
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v).strip()

    bad = lambda v: key(v) not in labels or (numbers and isinstance(v, bool))
    first_bad = next((i for i, v in enumerate(values) if bad(v)), None)
    if first_bad is None:
        assert ids == [labels.index(key(v)) for v in values]
    else:
        assert message.startswith(f"t.jsonl: row {first_bad + 1}, column 'label':"), message
        if not key(values[first_bad]):
            assert message.endswith("missing label"), message


# ---------------------------------------------------------------- CoNLL


@settings(FUZZ, max_examples=60)
@given(data=table_bytes() | st.binary(max_size=300))
def test_conll_any_bytes(tmp_path, data):
    """Sentences of non-empty tokens and tags, with increasing line numbers, or an error."""
    path = tmp_path / "train.conll"
    path.write_bytes(data)
    parsed, _ = outcome(lambda: read_conll(path), path)
    if parsed is not None:
        words, tags, lines = parsed
        assert len(words) == len(tags) == len(lines) > 0
        for w, t, n in zip(words, tags, lines, strict=True):
            assert len(w) == len(t) == len(n) > 0 and n == sorted(n)
            assert all(x.strip() for x in w) and all(x and x.strip() == x for x in t), (w, t)


TOKEN = st.text(chars("\t\n\r\x0b\x0c\x1c\x1d\x1e"))
TOKEN = TOKEN.filter(lambda s: s.split() == [s] and s != "-DOCSTART-")


@settings(FUZZ, max_examples=60)
@given(
    sentences=st.lists(
        st.lists(st.tuples(TOKEN, st.sampled_from(["O", "B-PER", "I-PER"])), min_size=1),
        min_size=1,
        max_size=4,
    ),
    sep=st.sampled_from(["\t", " "]),
    data=st.data(),
)
def test_conll_round_trip_and_bad_line(tmp_path, sentences, sep, data):
    """A well-formed file reads back word for word, line numbers included; a line without a
    tag, with an empty tag or with non-UTF-8 bytes, put anywhere, is named by its number."""
    lines, numbers = ["-DOCSTART-\tO", ""], []
    for sentence in sentences:
        numbers.append([])
        for token, tag in sentence:
            lines.append(f"{token}{sep}{tag}")
            numbers[-1].append(len(lines))
        lines.append("")
    path = tmp_path / "train.conll"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert read_conll(path) == (
        [[w for w, _ in s] for s in sentences],
        [[t for _, t in s] for s in sentences],
        numbers,
    )
    at = data.draw(st.integers(0, len(lines)))
    kind = data.draw(st.sampled_from(["token only", "empty tag", "bytes"]))
    token = data.draw(TOKEN)
    bad = {
        "token only": f"{token}\n".encode(),
        "empty tag": f"{token}\t\n".encode(),
        "bytes": with_bad_bytes(f"{token}{sep}O", data.draw(BAD_UTF8), len(token)) + b"\n",
    }[kind]
    body = [line.encode() + b"\n" for line in lines]
    body.insert(at, bad)
    path.write_bytes(b"".join(body))
    fails_at(lambda: read_conll(path), path, f"{path}: line {at + 1}:")
    # a tag column the line does not have (CoNLL-2003: token POS chunk NER) is named too
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    fails_at(lambda: read_conll(path, tag_column=3), path, f"{path}: line 3:")


# ---------------------------------------------------------------- tokenizer files


@FUZZ
@given(data=st.binary(max_size=300) | st.lists(WORD, max_size=12).map(lambda t: "\n".join(t)))
def test_vocab_txt_any_bytes(tmp_path, data):
    path = tmp_path / "vocab.txt"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    tok, _ = outcome(lambda: load_vocab_txt(path), path)
    assert tok is None or all(tok.token_to_id(t) is not None for t in SPECIAL_TOKENS)


VOCAB_TOKEN = st.text(chars("\n\r"), max_size=6)


@FUZZ
@given(
    tokens=st.lists(VOCAB_TOKEN.filter(lambda t: t not in SPECIAL_TOKENS), unique=True),
    order=st.permutations(range(5)),
    data=st.data(),
)
def test_vocab_txt_ids_are_line_numbers(tmp_path, tokens, order, data):
    """A token's id is its line number - 1, as in BERT's own reader (lines end at \\n or \\r,
    nowhere else); a repeated token, a missing special or non-UTF-8 bytes are named."""
    words = [SPECIAL_TOKENS[i] for i in order] + tokens
    words = data.draw(st.permutations(words))
    path = tmp_path / "vocab.txt"
    path.write_bytes("\n".join(words).encode() + b"\n")
    tok, message = outcome(lambda: load_tokenizer(path), path)
    assert message is None, message
    for i, w in enumerate(words):
        assert tok.token_to_id(w) == i, (w, i)
    at = data.draw(st.integers(1, len(words)))
    kind = data.draw(st.sampled_from(["repeat", "missing special", "bytes"]))
    if kind == "repeat":
        path.write_bytes("\n".join([*words, words[at - 1]]).encode() + b"\n")
        fails_at(lambda: load_vocab_txt(path), path, f"{path}:{len(words) + 1}:")
    elif kind == "missing special":
        special = data.draw(st.sampled_from(SPECIAL_TOKENS))
        path.write_bytes("\n".join(w for w in words if w != special).encode())
        assert special in fails_at(lambda: load_vocab_txt(path), path, f"{path}:")
    else:
        lines = [w.encode() for w in words]
        lines[at - 1] = with_bad_bytes(words[at - 1], data.draw(BAD_UTF8), 0)
        path.write_bytes(b"\n".join(lines))
        fails_at(lambda: load_vocab_txt(path), path, f"{path}:{at}:")


TOKENIZER_JSON = json.loads(symbol_tokenizer(["a", "b", "c"]).to_str())


def paths_in(value, prefix=()):
    """The key paths of every node of a JSON document."""
    yield prefix
    if isinstance(value, dict | list):
        for k, v in value.items() if isinstance(value, dict) else enumerate(value):
            yield from paths_in(v, (*prefix, k))


PATHS = list(paths_in(TOKENIZER_JSON))[1:]


def mutated(draw_path, new, delete):
    doc = json.loads(json.dumps(TOKENIZER_JSON))
    *parents, last = draw_path
    node = doc
    for k in parents:
        node = node[k]
    if delete:
        del node[last]
    else:
        node[last] = new
    return json.dumps(doc).encode()


@settings(FUZZ, max_examples=80)
@given(
    data=st.one_of(
        st.binary(max_size=200),
        JSON.map(lambda v: json.dumps(v).encode()),  # valid JSON, not a tokenizer
        st.builds(mutated, st.sampled_from(PATHS), JSON, st.booleans()),
        st.integers(1, 400).map(lambda n: json.dumps(TOKENIZER_JSON).encode()[:n]),
    )
)
def test_tokenizer_json_any_bytes(tmp_path, data):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(data)
    tok, _ = outcome(lambda: load_tokenizer(path), path)
    assert tok is None or all(tok.token_to_id(t) is not None for t in SPECIAL_TOKENS)
