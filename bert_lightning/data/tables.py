"""Reading task files (CSV/TSV/JSONL/Parquet tables, CoNLL BIO), grouped seeded splits, and the
padded batches. Every bad value is reported with its file, row (or line) and column."""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import io
import json
import logging
import lzma
import math
import re
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tokenizers import normalizers, pre_tokenizers
from torch.utils.data import DataLoader

from bert_lightning.atomic import atomic_path
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.shipped import group_defaults

log = logging.getLogger(__name__)
_UNPACK = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open}
# a corrupt or truncated archive (BadGzipFile is an OSError)
_UNREADABLE = (OSError, EOFError, zlib.error, zipfile.BadZipFile, lzma.LZMAError)


class DataError(UserError):
    """Bad input data; the message names the file, the row or line, and the column."""


class MissingColumn(DataError):
    """A table without a column a task reads; `key` is the task's config key naming it
    (`query_column`), so that a command can name its own option for it (`fixed_by`)."""

    def __init__(self, path, name: str, found: list, key: str, fix: str | None = None):
        self.path, self.name, self.found, self.key = path, name, found, key
        fix = fix or f"task.{key}=NAME reads another"
        super().__init__(f"{path}: no column {name!r}; the file has {found}: {fix}")

    def fixed_by(self, fix: str) -> MissingColumn:
        return MissingColumn(self.path, self.name, self.found, self.key, fix)


_FORMATS = {
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
    ".parquet": "parquet",
}


def table_format(path: Path, fmt: str | None = None) -> str:
    suffixes = [s for s in path.suffixes if s not in (".gz", ".zip", ".bz2", ".xz")]
    fmt = fmt or (_FORMATS.get(suffixes[-1].lower()) if suffixes else None)
    if fmt not in _FORMATS.values():
        raise DataError(
            f"{path}: unknown table format {fmt!r}; expected one of csv, tsv, jsonl, parquet"
        )
    return fmt


def data_file(path) -> Path:
    """The path of a task's data file, or a one-line error: missing, or a folder."""
    path = Path(path)
    if path.is_dir():
        raise MissingFileError(f"{path}: a folder; expected a data file")
    if not path.is_file():
        raise MissingFileError(f"{path}: no such data file")
    return path


@contextmanager
def _open_bytes(path: Path) -> Iterator[io.BufferedIOBase]:
    """A data file's bytes, unpacked by suffix: `.gz`, `.bz2`, `.xz`, or a `.zip` of one file."""
    with ExitStack() as stack:
        if path.suffix.lower() == ".zip":
            archive = stack.enter_context(zipfile.ZipFile(path))
            names = [n for n in archive.namelist() if not n.endswith("/") and "__MACOSX/" not in n]
            if len(names) != 1:
                raise DataError(f"{path}: a zip of {len(names)} files; expected one")
            yield stack.enter_context(archive.open(names[0]))
        else:
            yield stack.enter_context(_UNPACK.get(path.suffix.lower(), open)(path, "rb"))


def _decoding(encoding: str) -> str:
    """UTF-8 read as `utf-8-sig`: a byte order mark goes before any parsing (after it, a quoted
    first cell would keep its quotes, a header its first name)."""
    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


@contextmanager
def _open_text(path: Path, encoding: str) -> Iterator[io.TextIOWrapper]:
    """Text with its line ends as they are (a CRLF in a quoted cell is the cell's): what the csv
    module reads."""
    with (
        _open_bytes(path) as raw,
        io.TextIOWrapper(raw, encoding=_decoding(encoding), newline="") as f,
    ):
        yield f


def _undecodable_line(path: Path, encoding: str) -> int | str:
    """The line of the first bytes that are not `encoding` text (a UnicodeDecodeError's position
    is within the chunk read ahead). Lines end at LF, CR or CRLF, as when they are read."""
    with _open_bytes(path) as f:
        data = f.read()
    try:
        data.decode(encoding)
    except UnicodeDecodeError as e:
        text = data[: e.start].decode(encoding, errors="replace")
        return text.count("\n") + text.count("\r") - text.count("\r\n") + 1
    return "?"


def _unique(names: list[str]) -> list[str]:
    """A repeated column name gets `.1`, `.2`, ..., as pandas names them."""
    seen: set[str] = set()
    out = []
    for name in names:
        new, k = name, 0
        while new in seen:
            k += 1
            new = f"{name}.{k}"
        seen.add(new)
        out.append(new)
    return out


def _read_delimited(path: Path, fmt: str, encoding: str, header: bool, names) -> pd.DataFrame:
    """CSV/TSV with the csv module, every row checked: as many fields as `names` or the first row,
    else an error naming the line the row starts on (pandas pads a short row with empty cells,
    takes a long first row's extra field for an index so that every column shifts, and counts
    rows, not lines). Blank (or whitespace-only) lines are skipped, but refused in a one-column
    file, where each would be a row: `score` and `embed` give one row out per row in."""
    csv.field_size_limit(2**31 - 1)  # a long document in one cell: the default cap is 128 KiB
    quoting = csv.QUOTE_MINIMAL if fmt == "csv" else csv.QUOTE_NONE
    width = len(names) if names else None
    rows: list[list[str]] = []
    blank = None  # the line of the first blank line in a data row's place
    with _open_text(path, encoding) as f:
        reader = csv.reader(
            f, delimiter="," if fmt == "csv" else "\t", quoting=quoting, strict=True
        )
        start = 1  # the line the next row starts on
        try:
            for row in reader:
                if row and (row[0].strip() or len(row) > 1 or row == [""]):  # "" is a quoted cell
                    width = width or len(row)
                    if len(row) != width:
                        raise DataError(
                            f"{path}: line {start}: expected {width} fields, saw {len(row)}"
                        )
                    rows.append(row)
                elif blank is None and (rows or not header):  # not before a header
                    blank = start
                if width == 1 and blank is not None:  # as the .txt reader (commands/embed.py)
                    raise DataError(f"{path}: line {blank}: empty text (one row out per row in)")
                start = reader.line_num + 1
        except csv.Error as e:  # a quote never closed, or text after a closing quote
            raise DataError(f"{path}: line {start}: cannot be read as {fmt}: {e}") from None
    if not rows:
        raise DataError(f"{path}: empty file")
    if header:
        columns, rows = (list(names) if names else _unique(rows[0])), rows[1:]
    else:
        columns = list(names) if names else list(range(width))
    return pd.DataFrame(rows, columns=columns, dtype=str)


TABLE = group_defaults("task", "_table")  # how a task reads its files (conf/task/_table.yaml)


def read_table(
    path, fmt=None, encoding=TABLE["encoding"], header=TABLE["header"], names=None
) -> pd.DataFrame:
    """Cells of CSV/TSV are read as strings (no NA guessing), of JSON lines as JSON gave them
    (an integer stays one in a column with a float or a null), so every conversion is ours."""
    path = data_file(path)
    fmt = table_format(path, fmt)
    try:
        if fmt in ("csv", "tsv"):
            df = _read_delimited(path, fmt, encoding, header, names)
        elif fmt == "jsonl":
            df = pd.DataFrame(read_jsonl(path, encoding), dtype=object)
        else:
            df = pd.read_parquet(path)
    except UserError:  # already names the file (and line)
        raise
    except UnicodeDecodeError as e:
        line = _undecodable_line(path, encoding)
        raise DataError(f"{path}: line {line}: not {encoding} text ({e.reason})") from None
    except (ValueError, *_UNREADABLE) as e:
        raise DataError(f"{path}: cannot be read as {fmt}: {e}") from None
    if len(df) == 0:
        raise DataError(f"{path}: empty file (no data rows)")
    if fmt != "parquet":
        _refuse_utf8(path, encoding)
    return df


def _refuse_utf8(path: Path, encoding: str, sample: int = 1 << 22) -> None:
    """A file to be read as a single-byte encoding (latin-1, cp1252: every byte is a character
    there, so nothing fails) that is UTF-8 with non-ASCII text is refused in one line: its
    accents would be read as two characters each (`café` as `cafÃ©`), scored garbled and
    written back so, which no error would show."""
    if codecs.lookup(encoding).name in ("utf-8", "utf-8-sig", "ascii", "utf-16", "utf-32"):
        return
    with _open_bytes(path) as f:
        data = f.read(sample)
    word = re.search(rb"[^\s,;\"']*[\x80-\xff][^\s,;\"']*", data)  # the first non-ASCII word
    if word is None:
        return
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=False)
    except UnicodeDecodeError:
        return  # not UTF-8: the encoding given is the better reading
    line, word = data[: word.start()].count(b"\n") + 1, word.group()
    raise DataError(
        f"{path}: line {line} reads as UTF-8 ({word.decode('utf-8', 'replace')!r}), but the "
        f"encoding given is {encoding} ({word.decode(encoding, 'replace')!r}); a UTF-8 file is "
        "read with --encoding utf-8 (task.encoding=utf-8)"
    )


def read_jsonl(path: Path, encoding: str) -> list[dict]:
    """One JSON object per line (blank lines skipped); a bad line is named with its column."""
    rows = []
    try:
        with _open_text(path, encoding) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}:{e.colno}: invalid JSON ({e.msg})") from None
                except (ValueError, RecursionError) as e:  # over 4,300 digits; nested too deep
                    raise DataError(f"{path}:{n}: invalid JSON ({e})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{path}:{n}: a JSON {type(row).__name__}; expected an object")
                rows.append(row)
    except UnicodeDecodeError as e:
        line = _undecodable_line(path, encoding)
        raise DataError(f"{path}:{line}: not {encoding} text ({e.reason})") from None
    return rows


def write_table(df: pd.DataFrame, path: Path) -> None:
    """CSV (RFC 4180's CRLF line ends), TSV, JSONL or Parquet by extension, through a temporary
    name; `read_table` reads each back cell for cell. TSV is written as it is read, without
    quoting: a cell with a tab or a line break is refused. JSON numbers keep every digit
    (pandas' keep 10)."""
    fmt = table_format(path)
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            df.to_parquet(tmp, index=False)
        elif fmt == "csv":  # the csv module quotes a cell holding a line end's character: CR too
            df.to_csv(tmp, index=False, lineterminator="\r\n")
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                f.writelines(_jsonl_lines(df) if fmt == "jsonl" else _tsv_lines(df, path))


def _cells(df: pd.DataFrame) -> Iterator[tuple[int, list]]:
    """(row number from 1, its cells, a missing one None)."""
    for i, row in enumerate(df.itertuples(index=False, name=None), 1):
        yield i, [None if _missing(v) else v for v in row]


def _jsonl_lines(df: pd.DataFrame) -> Iterator[str]:
    names = [str(c) for c in df.columns]
    for _, cells in _cells(df):
        yield json.dumps(dict(zip(names, cells, strict=True)), ensure_ascii=False, default=str)
        yield "\n"


def _tsv_lines(df: pd.DataFrame, path: Path) -> Iterator[str]:
    names = [str(c) for c in df.columns]
    for i, cells in _cells(df):
        if i == 1:
            yield "\t".join(names) + "\n"
        text = ["" if v is None else str(v) for v in cells]
        for name, cell in zip(names, text, strict=True):
            if re.search(r"[\t\n\r]", cell):
                raise DataError(
                    f"{path}: row {i}, column {name!r}: a tab or line break, which TSV cannot "
                    "hold; write .csv, .jsonl or .parquet"
                )
        yield "\t".join(text) + "\n"


def column(df: pd.DataFrame, name: str, path, key: str) -> list:
    """The values of column `name`, which the task config's `key` names."""
    if name not in df.columns:
        raise MissingColumn(path, name, list(df.columns), key)
    return df[name].tolist()


def _missing(v) -> bool:
    """None, a float NaN, and pandas' missing scalars (`pd.NA` of its nullable dtypes, `NaT`),
    which a Parquet file's nullable columns read back as (as text: `<NA>`)."""
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and math.isnan(v))


def text_values(values: list, path, name: str) -> list[str]:
    """Strings the tokenizer takes: a lone surrogate (JSON's `"\\ud800"`) is none."""
    out = []
    for i, v in enumerate(values):
        if _missing(v):
            raise DataError(f"{path}: row {i + 1}, column {name!r}: missing text")
        text = str(v)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise DataError(
                f"{path}: row {i + 1}, column {name!r}: a lone surrogate "
                f"{text[e.start]!r} at character {e.start + 1}; not Unicode text"
            ) from None
        out.append(text)
    return out


def float_values(values: list, path, name: str) -> list[float]:
    out = []
    for i, v in enumerate(values):
        try:
            x = float(v)
        except (TypeError, ValueError, OverflowError):  # OverflowError: an int over 1e308
            x = None
        if x is None or not math.isfinite(x):
            raise DataError(f"{path}: row {i + 1}, column {name!r}: {v!r} is not a finite number")
        out.append(x)
    return out


def cell_text(v) -> str:
    """A cell as text, one spelling per value: a number JSON wrote `1.0` is `1`, as `1` is (a
    label or group of either is the same); a missing cell ''."""
    if _missing(v):
        return ""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def group_keys(values: list) -> list[str]:
    """Each cell as the group its row belongs to, what every grouping (a split, the cross-file
    check) compares: the words an uncased BERT tokenizer reads in it (its normalizer and
    pre-tokenizer, `tokenizers`' own), so that one written two ways stays on one side
    (`Café Book.1`, `cafe\u0301  book . 1` and `CAFE BOOK .1` are one; `东京大学` and `东京 大学`
    too): accents, case, control and invisible characters, and the spacing around punctuation
    and CJK ideographs aside."""
    normalize, split = _BERT_NORMALIZER.normalize_str, _BERT_WORDS.pre_tokenize_str
    return [" ".join(w for w, _ in split(normalize(cell_text(v)))) for v in values]


_BERT_NORMALIZER = normalizers.BertNormalizer(strip_accents=True, lowercase=True)
_BERT_WORDS = pre_tokenizers.BertPreTokenizer()


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and not _missing(v)


def label_strings(values: list, path, name: str, where="row", labels=None) -> list[str]:
    """Each cell as the label it names (`cell_text`), without surrounding spaces; a missing or
    blank one is a bad row, never a class; a JSON boolean among numbers too (whether `true` is
    the class `1` would be a guess); with `labels`, one outside them (the first bad row named)."""
    numbers = any(_is_number(v) for v in values)
    out = []
    for i, v in enumerate(values):
        key = cell_text(v).strip()
        if not key:
            raise DataError(f"{path}: {where} {i + 1}, column {name!r}: missing label")
        if numbers and isinstance(v, bool):
            raise DataError(
                f"{path}: {where} {i + 1}, column {name!r}: {v!r}, a JSON boolean among numbers; "
                "write every label of the column as a number or every one as true/false"
            )
        if labels is not None and key not in labels:
            raise DataError(
                f"{path}: {where} {i + 1}, column {name!r}: label {v!r} is not in the label "
                f"set {labels}"
            )
        out.append(key)
    return out


def label_values(values: list, labels: list[str], path, name: str, where="row") -> list[int]:
    """Each cell's index in `labels` (`label_strings`)."""
    index = {cell_text(l): i for i, l in enumerate(labels)}
    return [index[k] for k in label_strings(values, path, name, where, list(index))]


def read_conll(path, token_column: int = 0, tag_column: int = -1):
    """CoNLL: one `token ... tag` per line (tab or space separated), a blank line between
    sentences, `-DOCSTART-` lines skipped. Returns sentences of words, of tags, and the line
    number of every tag (for errors)."""
    path = data_file(path)
    need = max(2, *(c + 1 if c >= 0 else -c for c in (token_column, tag_column)))
    words, tags, lines = [], [], []
    cur = ([], [], [])
    try:
        with open(path, encoding="utf-8-sig") as f:
            for n, line in enumerate(f, 1):
                fields = line.rstrip("\n").split("\t") if "\t" in line else line.split()
                if not line.strip() or fields[0] == "-DOCSTART-":
                    if cur[0]:
                        words.append(cur[0]), tags.append(cur[1]), lines.append(cur[2])
                    cur = ([], [], [])
                    continue
                if len(fields) < need:
                    wanted = "a token and a tag" if need == 2 else f"{need} fields"
                    raise DataError(f"{path}: line {n}: expected {wanted}, got {line.strip()!r}")
                token, tag = fields[token_column], fields[tag_column].strip()
                if not token.strip() or not tag:
                    empty = "tag" if token.strip() else "token"
                    raise DataError(f"{path}: line {n}: empty {empty} in {line.strip()!r}")
                cur[0].append(token)
                cur[1].append(tag)
                cur[2].append(n)
    except UnicodeDecodeError as e:
        line = _undecodable_line(path, "utf-8")
        raise DataError(f"{path}: line {line}: not utf-8 text ({e.reason})") from None
    if cur[0]:
        words.append(cur[0]), tags.append(cur[1]), lines.append(cur[2])
    if not words:
        raise DataError(f"{path}: empty file (no sentences)")
    return words, tags, lines


def grouped_split(groups: list, fractions: dict[str, float], seed: int) -> dict[str, list[int]]:
    """Row indices per part; every row of a group lands in the same part. Groups are shuffled
    with `seed` and dealt to each named part until it holds its fraction of the rows; the rest
    is `train`. A part off its share by more than half of it (a group of most rows dealt
    whole) is one warning: the parts still hold whole groups."""
    order = sorted(set(groups), key=str)
    np.random.default_rng(seed).shuffle(order)
    rows: dict = {}
    for i, g in enumerate(groups):
        rows.setdefault(g, []).append(i)
    parts = {name: [] for name in fractions} | {"train": []}
    quotas = iter([(name, frac * len(groups)) for name, frac in fractions.items()])
    name, quota = next(quotas, ("train", math.inf))
    for g in order:
        while len(parts[name]) >= quota:
            name, quota = next(quotas, ("train", math.inf))
        parts[name].extend(rows[g])
    asked = fractions | {"train": 1 - sum(fractions.values())}
    got = {k: len(v) / len(groups) for k, v in parts.items()}
    if any(abs(got[k] - share) > share / 2 for k, share in asked.items()):
        log.warning(
            "a split by whole groups gives %s of the %d rows; asked %s (the largest group "
            "holds %d rows)",
            ", ".join(f"{k} {got[k]:.3f}" for k in asked), len(groups),
            ", ".join(f"{k} {share:.3f}" for k, share in asked.items()),
            max(len(r) for r in rows.values()),
        )  # fmt: skip
    return {k: sorted(v) for k, v in parts.items()}


def grouped_subsample(groups: list, n: int | None, seed: int) -> list[int]:
    """Exactly `n` rows (all when n is None or more), drawn with `seed`: whole groups in a
    shuffled order, the last one cut to hit `n`, so at most one group is partial (a ranking
    metric still sees whole queries but one)."""
    if n is None or n >= len(groups):
        return list(range(len(groups)))
    order = sorted(set(groups), key=str)
    np.random.default_rng(seed).shuffle(order)
    rows: dict = {}
    for i, g in enumerate(groups):
        rows.setdefault(g, []).append(i)
    kept: list[int] = []
    for g in order:
        kept.extend(rows[g][: n - len(kept)])
        if len(kept) == n:
            break
    return sorted(kept)


class GroupBatchSampler(torch.utils.data.BatchSampler):
    """Batches of whole groups (queries), shuffled every epoch: what a pairwise ranking loss
    needs, as it compares rows of one query within a batch.

    Under DDP, Lightning rebuilds it with `sampler=` the DistributedSampler it would have used;
    only that sampler's rank and world size are read: rank r takes batches r, r + R, ... of
    the epoch (the list wrapped round to a multiple of R, as DistributedSampler pads), so every
    rank steps the same number of times and a group never splits across ranks."""

    def __init__(self, groups: list, batch_size: int, seed: int, sampler=None):
        self.rows: dict = {}
        for i, g in enumerate(groups):
            self.rows.setdefault(g, []).append(i)
        self.batch_size, self.seed, self.epoch = batch_size, seed, 0
        self.sampler, self.drop_last = sampler, False
        distributed = isinstance(sampler, torch.utils.data.DistributedSampler)
        self.replicas, self.rank = (sampler.num_replicas, sampler.rank) if distributed else (1, 0)

    def _batches(self, epoch: int) -> list[list[int]]:
        keys = list(self.rows)
        np.random.default_rng(self.seed + epoch).shuffle(keys)
        batches, batch = [], []
        for g in keys:
            batch.extend(self.rows[g])
            if len(batch) >= self.batch_size:
                batches.append(batch)
                batch = []
        if batch:
            batches.append(batch)
        padded = -(-len(batches) // self.replicas) * self.replicas
        batches += batches[: padded - len(batches)]
        return batches[self.rank :: self.replicas]

    def __iter__(self):
        return _GroupBatches(self)

    def __len__(self):  # of the coming epoch: batch counts vary with the order
        return len(self._batches(self.epoch))


class _GroupBatches:
    """One epoch of a GroupBatchSampler; its state (epoch, batches handed out) travels in a
    StatefulDataLoader's checkpoint, so a resumed run continues the same epoch's order."""

    def __init__(self, sampler: GroupBatchSampler):
        self.sampler, self.epoch, self.yielded, self.batches = sampler, None, 0, None

    def __iter__(self):
        return self

    def __next__(self) -> list[int]:
        if self.batches is None:  # lazily, as the epoch counter moved in a generator
            if self.epoch is None:
                self.epoch = self.sampler.epoch
                self.sampler.epoch += 1
            self.batches = iter(self.sampler._batches(self.epoch)[self.yielded :])
        batch = next(self.batches)
        self.yielded += 1
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.yielded, self.batches = state["epoch"], state["yielded"], None
        if self.epoch is not None:
            self.sampler.epoch = self.epoch + 1


def collate(features: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Pads `input_ids`/`token_type_ids` (and makes `attention_mask`) to the longest in the batch,
    `labels` of tokens with -100, word-level fields with -100 (`word_labels`) and -1
    (`first_piece`); scalar fields are stacked."""
    T = max(len(f["input_ids"]) for f in features)
    pads = {"input_ids": pad_id, "token_type_ids": 0, "token_labels": -100}
    lengths = [len(f["input_ids"]) for f in features]
    out = {"attention_mask": torch.tensor([[1] * n + [0] * (T - n) for n in lengths])}
    for key, pad in pads.items():
        if key in features[0]:
            out[key] = torch.tensor([f[key] + [pad] * (T - len(f[key])) for f in features])
    if "word_labels" in features[0]:
        W = max(len(f["word_labels"]) for f in features)
        for key, pad in (("word_labels", -100), ("first_piece", -1)):
            out[key] = torch.tensor([f[key] + [pad] * (W - len(f[key])) for f in features])
    for key in ("label", "target", "group"):
        if key in features[0]:
            out[key] = torch.tensor([f[key] for f in features])
    return out


class EvalBatches(torch.utils.data.BatchSampler):
    """Rows 0..rows-1 in order, in batches of `batch_size`, each row once: what validation and
    test read (a DistributedSampler pads the ranks' shares with repeated rows, which every
    figure would count).

    Under DDP, Lightning rebuilds it with `sampler=` the DistributedSampler it would have used;
    only that sampler's rank and world size are read: rank r takes the r-th of R runs of
    consecutive rows (sizes within one), in as many batches as every other rank, as the ranks
    step together through per-batch collectives (the stop-signal check, training/interrupt.py):
    a shorter run ends on smaller batches (at `batch_size` 1, a longer run's last holds 2).
    Gathered in rank order, the runs are the rows in order: a metric kept row by row (a split's
    loss, NDCG by query) sees each query whole, in one process's order."""

    def __init__(self, rows: int, batch_size: int, sampler=None):
        distributed = isinstance(sampler, torch.utils.data.DistributedSampler)
        replicas, rank = (sampler.num_replicas, sampler.rank) if distributed else (1, 0)
        if 0 < rows < replicas:
            raise UserError(
                f"{rows} rows to validate or test on {replicas} processes: each needs one at least "
                "(fewer processes, or more rows)"
            )
        longest, shortest = -(-rows // replicas), rows // replicas
        batches = min(-(-longest // batch_size), shortest)  # on every rank
        first, end = rank * rows // replicas, (rank + 1) * rows // replicas
        n = end - first  # full batches, then of one row where fewer rows than batch_size left
        cuts = [first + min(i * batch_size, n - (batches - i)) for i in range(batches)] + [end]
        self.batches = [list(range(a, b)) for a, b in pairwise(cuts)]

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


def eval_loader(rows: list[dict], batch_size: int, pad_id: int) -> DataLoader:
    """Encoded rows in their order, padded per batch: what validation, a run's test and
    `evaluate` read, each row once however many processes read it (`EvalBatches`)."""
    batches = EvalBatches(len(rows), batch_size)
    return DataLoader(rows, batch_sampler=batches, collate_fn=partial(collate, pad_id=pad_id))
