import gzip
import json
from itertools import pairwise

import pytest

from bert_lightning.data.corpus import (
    BadRecordError,
    BadRecords,
    interleave_documents,
    iter_documents,
    resolve_files,
    split_document,
)
from bert_lightning.errors import UserError


def jsonl(path, records, gz=False):
    data = "".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return str(path)


def test_reads_files_folders_and_globs(tmp_path):
    a = jsonl(tmp_path / "c4-train.00000-of-01024.json.gz", [{"text": "one", "url": "u"}], gz=True)
    b = jsonl(tmp_path / "c4-train.00001-of-01024.json", [{"text": "two"}, {"text": "three"}])
    (tmp_path / "notes.md").write_text("ignored")
    assert resolve_files(str(tmp_path)) == [a, b]
    assert resolve_files(str(tmp_path / "c4-train.*")) == [a, b]
    assert list(iter_documents(resolve_files([a, b]))) == ["one", "two", "three"]


def test_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json.gz"):
        resolve_files(str(tmp_path / "missing.json.gz"))
    with pytest.raises(FileNotFoundError, match="no file matches"):
        resolve_files(str(tmp_path / "c4-*.json.gz"))


BAD_CASES = {
    "not_json": (
        '{"text": "ok"}\n{"text": oops}\n',
        "2:10: invalid JSON \\(Expecting value at column 10\\)",
    ),
    "no_text": ('{"text": "ok"}\n{"url": "x"}\n', "2: no 'text' field"),
    "empty": ('{"text": "ok"}\n{"text": "   "}\n', "2: empty document"),
    "not_str": ('{"text": "ok"}\n{"text": 5}\n', "2: 'text' is int"),
}


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_error_names_file_and_line(tmp_path, case):
    content, message = BAD_CASES[case]
    path = tmp_path / "shard.jsonl"
    path.write_text(content)
    with pytest.raises(BadRecordError, match=rf"shard\.jsonl:{message}"):
        list(iter_documents([str(path)]))


@pytest.mark.parametrize("case", sorted(BAD_CASES))
def test_bad_record_skip_counts(tmp_path, case):
    content, _ = BAD_CASES[case]
    path = tmp_path / "shard.jsonl"
    path.write_text(content + '{"text": "after"}\n')
    bad = BadRecords()
    assert list(iter_documents([str(path)], "skip", bad)) == ["ok", "after"]
    assert bad.count == 1 and "shard.jsonl:2" in bad.first[0]


def test_invalid_utf8_is_a_bad_record(tmp_path):
    path = tmp_path / "shard.jsonl"
    path.write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe"}\n')
    with pytest.raises(BadRecordError, match="shard.jsonl:2: invalid UTF-8"):
        list(iter_documents([str(path)]))


def test_corrupt_gzip(tmp_path):
    good = gzip.compress(b"".join(b'{"text": "doc %d"}\n' % i for i in range(2000)))
    path = tmp_path / "c4.json.gz"
    path.write_bytes(good[: len(good) // 2])  # truncated
    with pytest.raises(BadRecordError, match=r"c4\.json\.gz: unreadable after line \d+"):
        list(iter_documents([str(path)]))
    bad = BadRecords()
    docs = list(iter_documents([str(path)], "skip", bad))
    assert 0 < len(docs) < 2000 and bad.count == 1
    path.write_bytes(b"this is not gzip at all")
    with pytest.raises(BadRecordError, match=r"c4\.json\.gz: unreadable after line 0"):
        list(iter_documents([str(path)]))


def test_every_kind_of_bad_input_skipped_with_one_summary(tmp_path, caplog):
    big = "word " * 2_100_000  # a 10 MB document
    shard = tmp_path / "shard.jsonl"
    lines = [
        '{"text": "first"}',
        "{broken",
        '{"url": "no text"}',
        '{"text": ""}',
        '{"text": " \\n\\t "}',
        json.dumps({"text": big}),
        '{"text": "last"}',
    ]
    shard.write_bytes(("\n".join(lines) + "\n").encode() + b'{"text": "\xff"}\n')
    data = gzip.compress(b"".join(b'{"text": "gz %d"}\n' % i for i in range(3000)))
    truncated = tmp_path / "cut.json.gz"
    truncated.write_bytes(data[: len(data) // 2])
    files = [str(shard), str(truncated)]
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"text": "ok"}\n' + json.dumps({"text": big}) + "\n")
    with pytest.raises(BadRecordError, match=r"huge\.jsonl:2: document of 10,500,000 characters"):
        list(iter_documents([str(huge)], max_chars=1_000_000))
    bad = BadRecords()
    with caplog.at_level("WARNING"):
        docs = list(iter_documents(files, "skip", bad, max_chars=1_000_000))
    assert docs[:2] == ["first", "last"] and 0 < len(docs) - 2 < 3000
    assert bad.count == 7  # 6 bad records in the shard + the truncated gzip
    summary = [r.message for r in caplog.records if r.message.startswith("read ")]
    assert len(summary) == 1 and summary[0].startswith(f"read {len(docs)} documents, skipped 7")
    assert "shard.jsonl:2:" in summary[0]


def test_plain_text_blocks_or_lines(tmp_path):
    path = tmp_path / "books.txt"
    path.write_text("First para line one.\nline two.\n\n\nSecond doc.\n  \nThird doc.\n")
    assert resolve_files(str(tmp_path)) == [str(path)]
    assert list(iter_documents([str(path)])) == [
        "First para line one.\nline two.",
        "Second doc.",
        "Third doc.",
    ]
    assert list(iter_documents([str(path)], text_unit="line")) == [
        "First para line one.",
        "line two.",
        "Second doc.",
        "Third doc.",
    ]
    gz = tmp_path / "more.txt.gz"
    gz.write_bytes(gzip.compress(b"a\nb\n\n\xff\xfe\n\nc\n"))
    with pytest.raises(BadRecordError, match=r"more\.txt\.gz:4: invalid UTF-8"):
        list(iter_documents([str(gz)]))
    bad = BadRecords()
    assert list(iter_documents([str(gz)], "skip", bad)) == ["a\nb", "c"] and bad.count == 1
    with pytest.raises(ValueError, match="text_unit='page'"):
        list(iter_documents([str(path)], text_unit="page"))


# 2,500 characters: paragraphs of 150 to 450 characters joined by blank lines
PARAGRAPHS = [chr(ord("a") + i) * n for i, n in enumerate([450, 300, 150, 400, 350, 388, 450])]
BOOK = "\n\n".join(PARAGRAPHS)


def test_a_long_document_is_split_at_paragraph_breaks(tmp_path):
    assert len(BOOK) == 2500
    path = jsonl(tmp_path / "book.jsonl", [{"text": BOOK}, {"text": "short"}])
    *pieces, short = iter_documents([path], max_chars=1000, long_docs="split")
    assert short == "short"  # a document within the limit is read as it is
    assert all(len(p) <= 1000 for p in pieces) and len(pieces) == 3
    assert "\n\n".join(pieces) == BOOK  # cut at breaks only: all the text, in order
    for piece, after in pairwise(pieces):
        next_paragraph = after.split("\n\n")[0]  # each cut at the last break before the limit
        assert len(piece) + 2 + len(next_paragraph) > 1000
    assert list(iter_documents([path], max_chars=None, long_docs="split")) == [BOOK, "short"]


def test_without_paragraph_breaks_a_cut_falls_back_to_lines_spaces_then_the_limit():
    text = "a" * 100 + "\n\n" + "b" * 800 + "\n" + "c" * 500
    assert split_document(text, 1000) == ["a" * 100, "b" * 800, "c" * 500]
    words = "word " * 500
    assert split_document(words, 1000) == [words[:999], words[:999], words[:499]]
    assert split_document("x" * 2500, 1000) == ["x" * 1000, "x" * 1000, "x" * 500]


def test_long_docs_error_rejects_and_a_bad_value_is_named(tmp_path):
    path = jsonl(tmp_path / "book.jsonl", [{"text": BOOK}])
    message = r"book\.jsonl:1: document of 2,500 characters, over max_doc_chars=1,000; data\."
    with pytest.raises(BadRecordError, match=rf"{message}on_bad_record=skip skips such records"):
        list(iter_documents([path], max_chars=1000))
    with pytest.raises(UserError) as e:
        list(iter_documents([path], long_docs="x"))
    assert str(e.value) == "data.long_docs='x'; expected one of ('error', 'split')"


def test_interleaving_takes_a_document_of_each_file_in_turn(tmp_path):
    a = jsonl(tmp_path / "a.jsonl.gz", [{"text": f"a{i}"} for i in (1, 2, 3)], gz=True)
    b = tmp_path / "b.txt"
    b.write_text("b1\n")
    assert list(interleave_documents([a, str(b)])) == ["a1", "b1", "a2", "a3"]
    assert list(interleave_documents([a])) == list(iter_documents([a]))
