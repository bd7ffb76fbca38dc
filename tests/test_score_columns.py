"""One grammar for the columns and reading of a table, in every command that reads one:
`--column KEY=NAME` and `--encoding` (`commands.options`). A file whose columns are named
otherwise (`search_term`) is scored, evaluated and embedded as it is."""

import json

import numpy as np
import pandas as pd
import pytest

from bert_lightning.cli import main
from bert_lightning.data.tables import read_table
from finetune_fixtures import (
    ad_rows,
    finetuned_ckpt,
    relevance_ckpt,
    write_hf_folder,
    write_tokenizer,
)
from helpers import cli_error

NUMBERS = ("loss", "auroc", "acc", "ndcg@10")
RENAMED = {"query": "search_term", "ad": "product_title", "label": "relevant"}


@pytest.fixture
def tok(tmp_path):
    return write_tokenizer(tmp_path / "tokenizer.json")


def tables(tmp_path) -> tuple[str, str]:
    """The same rows as the model's task names its columns (UTF-8) and named otherwise
    (Latin-1, an accent in every ad)."""
    rows = pd.DataFrame(ad_rows(3)).assign(label=lambda d: (d.label == 3).astype(int))
    rows["ad"] += " café"
    rows.to_csv(tmp_path / "pairs.csv", index=False)
    other = tmp_path / "other.csv"
    rows.rename(columns=RENAMED).to_csv(other, index=False, encoding="latin-1")
    return str(tmp_path / "pairs.csv"), str(other)


def warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_score_reads_columns_named_otherwise(tmp_path, tok, caplog):
    ckpt = str(relevance_ckpt(tmp_path, tok)[0])
    pairs, other = tables(tmp_path)
    main(["score", ckpt, pairs, str(tmp_path / "want.csv")])
    want = pd.read_csv(tmp_path / "want.csv")["score"]
    columns = ["--column", "query=search_term", "--column", "ad=product_title"]
    main(["score", ckpt, other, str(tmp_path / "got.csv"), *columns, "--encoding", "latin-1"])
    got = pd.read_csv(tmp_path / "got.csv")  # written as UTF-8
    assert got["score"].tolist() == pytest.approx(want.tolist(), abs=1e-6)
    assert got["product_title"].str.endswith(" café").all()
    assert not warnings(caplog)


def test_a_column_key_the_task_has_not_is_one_line(tmp_path, tok, capsys):
    ckpt = str(relevance_ckpt(tmp_path, tok)[0])
    _, other = tables(tmp_path)
    err = cli_error(capsys, "score", ckpt, other, tmp_path / "x.csv", "--column", "text=x")
    assert err == (  # score reads the texts alone: a label column it would ignore is refused
        "error: --column text=x: expected KEY=NAME with KEY one of query, ad (the columns of "
        "its ad_relevance task)"
    )
    err = cli_error(capsys, "score", ckpt, other, tmp_path / "x.csv", "--column", "label=y")
    assert err.startswith("error: --column label=y: expected KEY=NAME with KEY one of query, ad")
    err = cli_error(capsys, "score", ckpt, other, tmp_path / "x.csv", "--encoding", "latin-1")
    assert err.endswith(
        "other.csv: no column 'query'; the file has "
        + str(["search_term", "product_title", "relevant"])
        + ": --column query=NAME reads another"
    )


@pytest.mark.parametrize(
    "option, message",
    [
        (["--batch-size", "0"], "argument --batch-size: expected a whole number >= 1, got '0'"),
        (["--max-seq-length", "-5"], "argument --max-seq-length: expected a whole number >= 1"),
        (["--max-seq-length", "100000"], "--max-seq-length 100000: more than the model's "),
    ],
)
def test_a_refused_value_names_its_option(tmp_path, tok, capsys, option, message):
    """`--batch-size 0` was a traceback (range() arg 3 must not be zero); a length past the
    model's positions failed on the first long row without naming the option."""
    ckpt = str(relevance_ckpt(tmp_path, tok)[0])
    pairs, _ = tables(tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["score", ckpt, pairs, str(tmp_path / "x.csv"), *option])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_evaluate_reads_columns_named_otherwise(tmp_path, tok, capsys):
    ckpt = str(relevance_ckpt(tmp_path, tok)[0])
    pairs, other = tables(tmp_path)
    main(["evaluate", ckpt, pairs, "--json", str(tmp_path / "want.json")])
    columns = [f"--column={key}={name}" for key, name in RENAMED.items()]
    got = tmp_path / "got.json"
    main(["evaluate", ckpt, other, *columns, "--encoding", "latin-1", "--json", str(got)])
    want, got = (json.loads(f.read_text())["metrics"] for f in (tmp_path / "want.json", got))
    assert got["rows"] == 9 and {k: got[k] for k in NUMBERS} == pytest.approx(
        {k: want[k] for k in NUMBERS}
    )


def test_embed_reads_a_column_named_otherwise(tmp_path, tok, caplog):
    write_hf_folder(tmp_path / "hf", tok)
    texts = ["the cat sat", "a café by the mat"]
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "texts.csv", index=False)
    pd.DataFrame({"body": texts}).to_csv(tmp_path / "b.csv", index=False, encoding="latin-1")
    hf, want, got = str(tmp_path / "hf"), tmp_path / "want.npy", tmp_path / "got.npy"
    main(["embed", hf, str(tmp_path / "texts.csv"), str(want)])
    latin = ["--encoding", "latin-1"]
    main(["embed", hf, str(tmp_path / "b.csv"), str(got), "--column", "text=body", *latin])
    np.testing.assert_allclose(np.load(got), np.load(want), atol=1e-6)
    assert not warnings(caplog)


ONE_COLUMN = {  # a one-column file's bytes -> its texts, or None: refused at line 3
    "whitespace.csv": (b"sentence\nthe cat sat\n   \na dog ran\n", None),
    "blank.tsv": (b"sentence\nthe cat sat\n\na dog ran\n", None),
    "crlf.csv": (b"sentence\r\nthe cat sat\r\n \t \r\na dog ran\r\n", None),
    "crlf_quoted.csv": (
        b'sentence\r\nthe cat sat\r\n"a\r\nmat"\r\na dog ran\r\n',
        ["the cat sat", "a\r\nmat", "a dog ran"],
    ),
    "bom.csv": (
        b'\xef\xbb\xbf"sentence"\nthe cat sat\n""\na dog ran\n',
        ["the cat sat", "", "a dog ran"],
    ),
    "separators.csv": (
        'sentence\n"the\u2028cat"\nsat\u2029on\n"a dog ran"\n'.encode(),
        ["the\u2028cat", "sat\u2029on", "a dog ran"],
    ),
}


@pytest.mark.parametrize("name", list(ONE_COLUMN))
def test_a_one_column_file_gives_a_row_out_per_row_in(tmp_path, tok, capsys, name):
    """A blank or whitespace-only line of a one-column CSV/TSV is a row whose text is empty:
    refused in one line, as a `.txt` file's, never dropped (3 rows in, 2 scored). CRLF line
    ends, a byte order mark, a quoted "" and U+2028/U+2029 inside a cell keep every row."""
    data, texts = ONE_COLUMN[name]
    path = tmp_path / name
    path.write_bytes(data)
    ckpt = finetuned_ckpt(tmp_path / "cls.ckpt", tok, "task.labels=[neg,pos]")
    write_hf_folder(tmp_path / "hf", tok)
    out, npy = tmp_path / f"scored{path.suffix}", tmp_path / "e.npy"
    embed = ("embed", tmp_path / "hf", path, npy, "--column", "text=sentence")
    if texts is None:
        refusal = f"error: {path}: line 3: empty text (one row out per row in)"
        assert cli_error(capsys, "score", ckpt, path, out) == refusal
        assert cli_error(capsys, *embed) == refusal
        return
    main(["score", str(ckpt), str(path), str(out)])
    assert f"wrote 3 scored rows to {out}" in capsys.readouterr().out
    assert read_table(out)["sentence"].tolist() == texts
    if "" in texts:  # an empty text has no vector: refused by its row
        err = cli_error(capsys, *embed)
        assert err == f"error: {path}: row 2, column 'sentence': empty text (one vector per text)"
        return
    main([str(a) for a in embed])
    assert np.load(npy).shape == (3, 32)


def test_a_text_file_is_cut_at_line_ends_only(tmp_path, tok):
    """Unicode line and paragraph separators, a form feed or a vertical tab inside a line of a
    .txt file are text, as in a table's cell: 3 lines in (CRLF, CR, LF), 3 vectors out."""
    write_hf_folder(tmp_path / "hf", tok)
    (tmp_path / "texts.txt").write_bytes("a\u2028cat\r\nthe\x0cmat\x0bsat\rby\u2029the\n".encode())
    main(["embed", str(tmp_path / "hf"), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy")])
    assert np.load(tmp_path / "v.npy").shape[0] == 3
