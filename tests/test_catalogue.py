"""A catalogue's index (`bert-lightning index`) and scoring from it (`score --index`): the
vectors are the bi-encoder's, the scores pair scoring's, and what the index checks (another
encoder, a changed catalogue, a file cut short or edited) is one line."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bert_lightning.catalogue import build_index, read_index
from bert_lightning.cli import main
from bert_lightning.commands.export_hf import export_hf
from bert_lightning.inference import load_finetuned
from finetune_fixtures import ad_rows, finetuned_ckpt, our_scores, write_csv, write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def bi_encoder(path, tok):
    """A fine-tuned bi-encoder checkpoint (random tiny weights), its head off its start."""
    ckpt = finetuned_ckpt(path, tok, "task=ad_relevance", "task.architecture=bi_encoder")
    raw = torch.load(ckpt, weights_only=True)
    raw["state_dict"]["model.classifier.weight"].fill_(6.0)
    raw["state_dict"]["model.classifier.bias"].fill_(-2.0)
    torch.save(raw, ckpt)
    return ckpt


@pytest.fixture
def catalogue(tmp_path, tok):
    """(checkpoint, catalogue.csv, its ids by ad, the rows of ad_rows(8))."""
    rows = ad_rows(8)
    ads = sorted({r["ad"] for r in rows})
    ids = {ad: f"sku-{n:03d}" for n, ad in enumerate(ads)}
    write_csv(tmp_path / "catalogue.csv", [{"sku": ids[a], "title": a} for a in ads])
    return bi_encoder(tmp_path / "bi.ckpt", tok), tmp_path / "catalogue.csv", ids, rows


def index(ckpt, catalogue, out, *more):
    main(["index", str(ckpt), str(catalogue), str(out), "--column", "id=sku", "--column",
          "ad=title", *more])  # fmt: skip


def test_scores_from_the_index_are_pair_scores(tmp_path, catalogue, capsys):
    """`score --index` of (query, id) rows gives what `score` of the (query, ad) rows gives; the
    index's vectors are the bi-encoder's at unit length, in the catalogue's order."""
    ckpt, cat, ids, rows = catalogue
    index(ckpt, cat, tmp_path / "ix")
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 'ix'}: {len(ids)} ads\n")
    ix = read_index(tmp_path / "ix")
    assert ix.ids == list(ids.values()) and ix.ads == list(ids)
    np.testing.assert_allclose(np.linalg.norm(ix.vectors, axis=1), 1.0, atol=1e-6)
    write_csv(tmp_path / "rows.csv", [{"query": r["query"], "sku": ids[r["ad"]]} for r in rows])
    main(["score", str(ckpt), str(tmp_path / "rows.csv"), str(tmp_path / "scored.csv"),
          "--index", str(tmp_path / "ix"), "--column", "id=sku"])  # fmt: skip
    got = torch.tensor(pd.read_csv(tmp_path / "scored.csv")["score"].to_numpy(), dtype=torch.float)
    pairs = [(r["query"], r["ad"]) for r in rows]
    torch.testing.assert_close(got, our_scores(ckpt, pairs), atol=1e-5, rtol=0)
    assert len(set(got.tolist())) > len(rows) // 2  # the pairs' own scores, not a constant


def test_an_index_reads_back_the_ids_and_ads_it_was_given(tmp_path, tok):
    """Line and paragraph separators, NEL and quotes inside an ad, ids that look like numbers:
    the index's table reads back as written."""
    ids = ["007", "7", "1e3", "a b"]
    ads = ["the film\u2028was great", "a\u2029plot\x85show", 'bob "said" \\n', "tab\there"]
    ckpt = bi_encoder(tmp_path / "bi.ckpt", tok)
    build_index(load_finetuned(ckpt), ckpt, ids, ads, tmp_path / "ix")
    ix = read_index(tmp_path / "ix")
    assert (ix.ids, ix.ads) == (ids, ads)


def test_an_index_serves_the_checkpoint_and_its_export_alike(tmp_path, catalogue, capsys):
    """The encoder's fingerprint is its weights', not its file's: an index built from the .ckpt
    is up to date for its sentence-transformers folder; another encoder's is refused."""
    ckpt, cat, ids, _ = catalogue
    index(ckpt, cat, tmp_path / "ix")
    folder = export_hf(str(ckpt), str(tmp_path / "st"))
    capsys.readouterr()
    index(folder, cat, tmp_path / "ix")
    assert capsys.readouterr().out == f"{tmp_path / 'ix'}: up to date with {cat} ({len(ids)} ads)\n"
    other = finetuned_ckpt(tmp_path / "other.ckpt", write_tokenizer(tmp_path / "t.json"),
                           "task=ad_relevance", "task.architecture=bi_encoder")  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        index(other, cat, tmp_path / "ix")
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'ix'}: built by another encoder than {other} (its vectors would not "
        f"be this model's); bert-lightning index {other} CATALOGUE {tmp_path / 'ix'}\n"
    )


def test_a_model_of_other_settings_with_the_same_weights_is_another_encoder(tmp_path, catalogue):
    """The fingerprint holds the encoder's shape, not only its weights: the same tensors under
    another `layer_norm_eps` compute other vectors."""
    ckpt, cat, _, _ = catalogue
    folder = Path(export_hf(str(ckpt), str(tmp_path / "st")))
    index(folder, cat, tmp_path / "ix")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"layer_norm_eps": 0.5}))
    with pytest.raises(SystemExit):
        index(folder, cat, tmp_path / "ix")


def test_a_changed_catalogue_is_reported_and_built_again_on_request(tmp_path, catalogue, capsys):
    ckpt, cat, ids, _ = catalogue
    index(ckpt, cat, tmp_path / "ix")
    table = pd.read_csv(cat, dtype=str)
    table.loc[1, "title"] += " deluxe"
    table = pd.concat([table.drop(index=2), pd.DataFrame([{"sku": "new-1", "title": "the film"}])])
    table.to_csv(cat, index=False)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        index(ckpt, cat, tmp_path / "ix")
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'ix'}: {cat} changed since: 1 added ('new-1'); 1 removed "
        "('sku-002'); 1 edited ('sku-001'); --overwrite rebuilds it\n"
    )
    index(ckpt, cat, tmp_path / "ix", "--overwrite")
    assert read_index(tmp_path / "ix").ids == table["sku"].tolist()


@pytest.mark.parametrize(
    ("spoil", "says"),
    [
        (lambda ix: (ix / "vectors.npy").write_bytes((ix / "vectors.npy").read_bytes()[:-64]),
         "vectors.npy: not the file this index wrote (its digest differs from index.json's: cut "
         "short or edited); build the index again"),
        (lambda ix: (ix / "ads.jsonl").write_text(
            "".join(reversed((ix / "ads.jsonl").read_text().splitlines(keepends=True)))),
         "ads.jsonl: not the file this index wrote (its digest differs from index.json's: cut "
         "short or edited); build the index again"),
        (lambda ix: (ix / "index.json").unlink(),
         "index.json: no such file (an index folder has index.json, vectors.npy and ads.jsonl: "
         "bert-lightning index writes them)"),
    ],
    ids=["vectors cut short", "ids given other vectors", "no record"],
)  # fmt: skip
def test_a_spoilt_index_is_one_line(tmp_path, catalogue, capsys, spoil, says):
    ckpt, cat, _, rows = catalogue
    index(ckpt, cat, tmp_path / "ix")
    spoil(tmp_path / "ix")
    write_csv(tmp_path / "rows.csv", [{"query": "a", "id": "sku-000"}])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["score", str(ckpt), str(tmp_path / "rows.csv"), str(tmp_path / "s.csv"),
              "--index", str(tmp_path / "ix")])  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'ix'}/") and says in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ([{"sku": "a", "title": "the film"}, {"sku": "a", "title": "a plot"}],
         "row 2: id 'a' again (first at row 1)"),
        ([{"sku": "a", "title": " "}], "row 1: id 'a' has a blank ad"),
    ],
    ids=["an id twice", "a blank ad"],
)  # fmt: skip
def test_a_catalogue_with_an_id_twice_or_a_blank_ad_is_refused(tmp_path, tok, capsys, rows, says):
    write_csv(tmp_path / "cat.csv", rows)
    with pytest.raises(SystemExit):
        index(bi_encoder(tmp_path / "bi.ckpt", tok), tmp_path / "cat.csv", tmp_path / "ix")
    assert capsys.readouterr().err == f"error: {tmp_path / 'cat.csv'}: {says}\n"
    assert not (tmp_path / "ix").exists()


def test_only_a_bi_encoder_indexes(tmp_path, tok, capsys):
    cross = finetuned_ckpt(tmp_path / "cross.ckpt", tok, "task=ad_relevance")
    write_csv(tmp_path / "cat.csv", [{"id": "a", "ad": "the film"}])
    with pytest.raises(SystemExit):
        main(["index", str(cross), str(tmp_path / "cat.csv"), str(tmp_path / "ix")])
    assert capsys.readouterr().err == (
        f"error: {cross}: not a fine-tuned bi-encoder's .ckpt or export-hf folder (an index holds "
        "the vectors a bi-encoder, task.architecture=bi_encoder, scores by, as PyTorch computes "
        "them: not an export-onnx folder's)\n"
    )


def test_an_unknown_id_is_named(tmp_path, catalogue, capsys):
    ckpt, cat, ids, _ = catalogue
    index(ckpt, cat, tmp_path / "ix")
    write_csv(tmp_path / "rows.csv", [{"query": "a", "id": "sku-000"}, {"query": "a", "id": "x"}])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["score", str(ckpt), str(tmp_path / "rows.csv"), str(tmp_path / "s.csv"),
              "--index", str(tmp_path / "ix")])  # fmt: skip
    assert capsys.readouterr().err == "error: ids ['x']: not in the index ix\n"
    assert json.loads((tmp_path / "ix" / "index.json").read_text())["count"] == len(ids)


def test_top_k_is_best_first_and_equal_scores_by_row():
    from bert_lightning.catalogue import top_k

    scores = torch.tensor([[0.5, 0.9, 0.5, 0.9, 0.1], [0.2, 0.2, 0.2, 0.2, 0.3]])
    best, rows = top_k(scores, 3)
    assert rows.tolist() == [[1, 3, 0], [4, 0, 1]]
    torch.testing.assert_close(best, torch.tensor([[0.9, 0.9, 0.5], [0.3, 0.2, 0.2]]))
    assert top_k(scores, 9)[1].tolist() == [[1, 3, 0, 2, 4], [4, 0, 1, 2, 3]]  # all there are
