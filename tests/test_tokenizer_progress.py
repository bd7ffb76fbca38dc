"""Training a tokenizer is never silent off a terminal: each pass says, every
`progress.SECONDS` (here made short), how many documents it has read, also while a document is
slow to come (a large file still being read before its first)."""

import re
import time

from bert_lightning import progress
from bert_lightning.data.tokenizer import train_wordpiece

DOCS = [f"the quick brown fox number {i} jumps over the lazy dog" for i in range(4)]


def slow_documents():
    """The documents, the first and the third after a wait of a few `SECONDS`."""
    for i, text in enumerate(DOCS):
        if i in (0, 2):
            time.sleep(0.3)
        yield text


def test_each_pass_names_the_documents_read_while_they_are_slow(monkeypatch, capsys):
    monkeypatch.setattr(progress, "SECONDS", 0.05)
    train_wordpiece(slow_documents, vocab_size=100)
    err = capsys.readouterr().err.splitlines()
    for n in (1, 2):
        name = f"tokenizer, pass {n} of 2"
        assert f"{name} ..." in err
        of = " of 4" if n == 2 else ""  # the first pass counts them (up to max_docs)
        line = re.compile(rf"{name}, (\d){of} documents read: \dm\d\ds so far")
        read = [int(m[1]) for m in map(line.fullmatch, err) if m]
        assert read[0] == 0 and 2 in read, err  # before the first document, and mid-pass
