"""One grammar for the columns and reading of a table, in every command that reads one:
`--column KEY=NAME` and `--encoding` (`commands.options`). A file whose columns are named
otherwise (`search_term`) is scored, evaluated and embedded as it is; the old spellings
(`--query-column`, embed's `--column NAME`) still work, each with one warning naming the new."""

import json

import numpy as np
import pandas as pd
import pytest

from bert_lightning.cli import main
from finetune_fixtures import ad_rows, relevance_ckpt, write_hf_folder, write_tokenizer
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
    old = ["--query-column", "search_term", "--ad-column", "product_title"]
    main(["score", ckpt, other, str(tmp_path / "old.csv"), *old, "--encoding", "latin-1"])
    old_scores = pd.read_csv(tmp_path / "old.csv")["score"]
    assert old_scores.tolist() == pytest.approx(want.tolist(), abs=1e-6)
    assert warnings(caplog) == [
        "--query-column search_term is deprecated (removed in the next release); "
        "use --column query=search_term",
        "--ad-column product_title is deprecated (removed in the next release); "
        "use --column ad=product_title",
    ]


def test_a_column_key_the_task_has_not_is_one_line(tmp_path, tok, capsys):
    ckpt = str(relevance_ckpt(tmp_path, tok)[0])
    _, other = tables(tmp_path)
    err = cli_error(capsys, "score", ckpt, other, tmp_path / "x.csv", "--column", "text=x")
    assert err.startswith("error: --column text=x: expected KEY=NAME with KEY one of ")
    assert err.endswith(", query, ad, clicks, impressions (the columns of its ad_relevance task)")
    err = cli_error(capsys, "score", ckpt, other, tmp_path / "x.csv", "--encoding", "latin-1")
    assert err.endswith(
        "other.csv: no column 'query'; the file has "
        + str(["search_term", "product_title", "relevant"])
    )


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
    main(["embed", hf, str(tmp_path / "b.csv"), str(got), "--column", "body", *latin])
    np.testing.assert_allclose(np.load(got), np.load(want), atol=1e-6)
    assert warnings(caplog) == [
        "--column body is deprecated (removed in the next release); use --column text=body"
    ]
