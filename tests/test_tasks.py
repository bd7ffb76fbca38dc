"""Tasks and tables: a metric with no value on its rows is NaN and said so, never 0; a monitor fits
the labels and the validation rows; a missing label is a bad row, never a class; a byte order
mark goes before the parsing; metrics on degenerate rows and on any batching, tables written and
read back, what is fitted and what is held out."""

import logging
import math

import pandas as pd
import pytest
import torch
from scipy import stats
from tokenizers import normalizers, pre_tokenizers

from bert_lightning.data.tables import (
    DataError,
    group_keys,
    grouped_split,
    read_conll,
    read_table,
    text_values,
    write_table,
)
from bert_lightning.errors import UserError
from bert_lightning.tasks.ad_relevance import score_metrics
from bert_lightning.tasks.kinds import load_splits, make_task
from finetune_fixtures import (
    ad_rows,
    cfg_for,
    computed,
    regression_rows,
    sentiment_rows,
    task_cfg,
    write_conll,
    write_csv,
    write_jsonl,
)


def undefined_said(caplog, text: str) -> bool:
    return any(text in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def clicks_rows(n_queries: int) -> list[dict]:
    """Click rates below 0.5 (as most are): no row reaches AUROC's relevance of 0.5."""
    return [
        {"query": f"q{q}", "ad": f"ad {a}", "clicks": a, "impressions": 10}
        for q in range(n_queries)
        for a in range(4)
    ]


# ---------------------------------------------------------------- row 5: AUROC of one class


def test_auroc_of_one_class_is_nan_and_said(caplog):
    """torchmetrics gives 0 on rows of one class; a baseline's AUROC is read the same way."""
    task = make_task(task_cfg("ad_relevance"))
    batch = {"target": torch.zeros(4), "group": torch.tensor([0, 0, 1, 1])}
    with caplog.at_level(logging.WARNING):
        got = computed(task, torch.tensor([[0.1], [0.2], [0.3], [0.4]]), batch)
    assert math.isnan(got["auroc"])
    assert undefined_said(caplog, "AUROC is undefined on rows of one class (0 relevant, 4 not)")
    table = {"target": [1.0, 1.0, 1.0], "group": ["a", "a", "b"]}
    baseline = score_metrics(task, table, torch.tensor([3.0, 1.0, 2.0]))
    assert math.isnan(baseline["test/auroc"])


def test_click_rates_are_no_auroc_labels(tmp_path):
    """`label_type=clicks` has no relevant/irrelevant rows: no AUROC, and `auroc` as monitor is
    refused before any training, naming the key and what fits."""
    train = write_csv(tmp_path / "clicks.csv", clicks_rows(20))
    task = make_task(cfg_for("ad_relevance", train, label_type="clicks"))
    assert sorted(task.metrics()) == ["ndcg@10", "spearman"]
    with pytest.raises(UserError) as e:
        load_splits(task, 0)
    assert str(e.value) == (
        "task.monitor='auroc': not a metric of this task (task.label_type=clicks); "
        "expected one of ['spearman', 'ndcg@10', 'loss']"
    )
    fits = make_task(cfg_for("ad_relevance", train, label_type="clicks", monitor="spearman"))
    _, tables = load_splits(fits, 0)
    assert sum(len(t["target"]) for t in tables.values()) == 80


def test_a_validation_split_of_one_class_is_refused_for_auroc(tmp_path):
    """An AUROC monitor undefined at every validation would keep the first checkpoint and stop
    the run early; refused at start, naming the split and its counts."""
    train = write_csv(tmp_path / "ads.csv", [{"query": "p", "ad": f"a{i}", "label": i % 2}
                                              for i in range(8)])  # fmt: skip
    dev = write_csv(tmp_path / "dev.csv", [{"query": "q", "ad": f"b{i}", "label": 0}
                                            for i in range(5)])  # fmt: skip
    task = make_task(cfg_for("ad_relevance", train, validation_file=str(dev), test_file=str(dev)))
    with pytest.raises(DataError) as e:
        load_splits(task, 0)
    assert str(e.value) == (
        f"{dev}: the validation part: task.monitor=auroc is undefined on rows of one class "
        "(0 relevant, 5 not)"
    )


def test_a_validation_part_without_a_value_for_the_monitor_is_refused(tmp_path):
    """The same for MCC on one class, Spearman on one target value, entity F1 without an
    entity: each named with the file and what its rows lack."""
    train = write_csv(tmp_path / "train.csv", sentiment_rows(20))
    dev = write_csv(tmp_path / "dev.csv", [r for r in sentiment_rows(12) if r["label"] == 1])
    task = cfg_for("seq_classification", train, validation_file=str(dev), monitor="mcc")
    with pytest.raises(DataError) as e:
        load_splits(make_task(task), 0)
    assert str(e.value) == (
        f"{dev}: the validation part: task.monitor=mcc is undefined on rows of one class (6 rows)"
    )
    load_splits(make_task(task | {"monitor": "acc"}), 0)  # accuracy has a value
    rows = [{"text": "a", "target": 2.0}] * 4
    flat = write_jsonl(tmp_path / "flat.jsonl", rows)
    train = write_jsonl(tmp_path / "reg.jsonl", regression_rows(20))
    task = cfg_for("regression", train, validation_file=str(flat), monitor="spearman", mode="max")
    with pytest.raises(DataError, match="spearman is undefined on targets of one value$"):
        load_splits(make_task(task), 0)
    conll = write_conll(tmp_path / "train.conll")
    plain = tmp_path / "dev.conll"
    plain.write_text("is\tO\n")
    task = cfg_for("token_classification", conll, validation_file=str(plain), test_file=str(plain))
    with pytest.raises(DataError, match="f1 is undefined with no entity in the gold tags$"):
        load_splits(make_task(task), 0)


# ---------------------------------------------------------------- row 8: a missing label


@pytest.mark.parametrize("bad", ["", None, "absent"])
def test_a_missing_label_is_a_bad_row_not_a_class(tmp_path, bad):
    rows = sentiment_rows(12)
    if bad == "absent":
        del rows[2]["label"]
    else:
        rows[2]["label"] = bad
    if bad == "":
        train = write_csv(tmp_path / "train.csv", rows)
    else:
        train = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError) as e:
        load_splits(make_task(cfg_for("seq_classification", train)), 0)
    assert str(e.value) == f"{train}: row 3, column 'label': missing label"


def test_integer_labels_of_json_lines_stay_integers(tmp_path):
    """A JSON integer is read as written: `1`, never `1.0` (a column with one float in it)."""
    rows = sentiment_rows(12)
    rows[0]["score"] = 0.5  # another column's float: the labels stay as written
    rows[1]["label"] = " 1"  # spaces around a label name no other class
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    completed, tables = load_splits(make_task(cfg_for("seq_classification", train)), 0)
    assert completed.cfg.labels == ["0", "1"]
    df = read_table(write_jsonl(tmp_path / "mixed.jsonl", [{"y": 1}, {"y": 2.5}, {"y": None}]))
    assert [str(v) for v in df["y"]] == ["1", "2.5", "None"]


# ---------------------------------------------------------------- row 13: a byte order mark


def test_a_byte_order_mark_goes_before_parsing(tmp_path):
    """A quoted first cell loses its quotes, a header its first name, a JSON line parses, a
    CoNLL file's first token is the word."""
    bare = tmp_path / "bare.csv"
    bare.write_bytes('\ufeff"hello",1\nbye,0\n'.encode())
    df = read_table(bare, header=False, names=["sentence", "label"])
    assert df.values.tolist() == [["hello", "1"], ["bye", "0"]]
    headed = tmp_path / "headed.tsv"
    headed.write_bytes("\ufeffquery\tad\tlabel\nq\ta\t1\n".encode())
    assert list(read_table(headed).columns) == ["query", "ad", "label"]
    quoted = tmp_path / "quoted.csv"
    quoted.write_bytes('\ufeff"query","ad","label"\nq,a,1\n'.encode())
    assert list(read_table(quoted).columns) == ["query", "ad", "label"]
    lines = tmp_path / "rows.jsonl"
    lines.write_bytes('\ufeff{"query": "q"}\n'.encode())
    assert read_table(lines).values.tolist() == [["q"]]
    conll = tmp_path / "bom.conll"
    conll.write_bytes("\ufeffbob\tB-person\n".encode())
    assert read_conll(conll)[0] == [["bob"]]


# ---------------------------------------------------------------- sweep: metrics


def test_classification_metrics_of_one_class_are_nan(caplog):
    """Validation rows of one class: MCC and F1 are undefined whatever is predicted (0 was
    returned); accuracy is defined. MCC keeps 0 for constant predictions over two classes."""
    task = make_task(task_cfg("seq_classification", labels=["0", "1"]))
    label = torch.zeros(4, dtype=torch.long)
    with caplog.at_level(logging.WARNING):
        got = computed(task, torch.tensor([[1.0, 0.0]] * 4), {"label": label})
    assert got["acc"] == 1.0 and math.isnan(got["mcc"]) and math.isnan(got["f1"])
    assert undefined_said(caplog, "MCC is undefined on rows of one class")
    assert undefined_said(caplog, "F1 is undefined with no positive row, true or predicted")
    three = make_task(task_cfg("seq_classification", labels=["a", "b", "c"]))
    got = computed(three, torch.tensor([[1.0, 0.0, 0.0]] * 4), {"label": label})
    assert math.isnan(got["mcc"]) and got["f1"] == 1.0  # macro over the classes present


def test_ranking_metrics_without_order_are_nan(caplog):
    """Spearman of one row or of one target value, NDCG with nothing relevant: NaN (they were
    0); Spearman of constant scores over targets with an order stays 0 (ranking.correlation)."""
    task = make_task(task_cfg("ad_relevance", label_type="graded"))
    group = torch.tensor([0, 0, 1])
    with caplog.at_level(logging.WARNING):
        got = computed(task, torch.tensor([[0.1], [0.5], [0.3]]), {"target": torch.zeros(3),
                                                                    "group": group})  # fmt: skip
    assert math.isnan(got["spearman"]) and math.isnan(got["ndcg@10"])
    assert undefined_said(caplog, "Spearman is undefined on targets of one value")
    assert undefined_said(caplog, "NDCG is undefined with no relevant row in any query")
    one = computed(task, torch.tensor([[0.1]]), {"target": torch.ones(1), "group": group[:1]})
    assert math.isnan(one["spearman"])
    flat = computed(task, torch.zeros(3, 1), {"target": torch.tensor([0.0, 0.5, 1.0]),
                                             "group": group})  # fmt: skip
    assert flat["spearman"] == 0.0
    # a tie of a relevant and an irrelevant row: the mean over its orders, whichever comes first
    tie = [torch.tensor(t) for t in ([1.0, 0.0], [0.0, 1.0])]
    ndcgs = [computed(task, torch.zeros(2, 1), {"target": t, "group": group[:2]}) for t in tie]
    assert ndcgs[0]["ndcg@10"] == ndcgs[1]["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3)) / 2)


def test_regression_correlations_of_one_row_are_nan():
    task = make_task(task_cfg("regression", target_mean=0.0, target_std=1.0))
    got = computed(task, torch.tensor([[2.0]]), {"target": torch.tensor([1.0])})
    assert got["mse"] == 1.0 and math.isnan(got["pearson"]) and math.isnan(got["spearman"])


def test_entity_scores_without_entities_are_nan():
    """No gold entity and none predicted: precision, recall and F1 are 0/0 (0 was reported);
    predicting none of the gold ones: recall and F1 0, precision undefined."""
    task = make_task({**task_cfg("token_classification"), "labels": ["O", "B-x", "I-x"]})
    first = torch.tensor([[1, 2]])
    batch = {"first_piece": first, "word_labels": torch.tensor([[0, 0]])}
    logits = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]])
    got = computed(task, logits, batch)
    assert all(math.isnan(v) for v in got.values())
    got = computed(task, logits, batch | {"word_labels": torch.tensor([[1, 0]])})
    assert math.isnan(got["precision"]) and got["recall"] == 0.0 and got["f1"] == 0.0


@pytest.mark.parametrize("kind", ["ad_relevance", "seq_classification", "regression"])
def test_every_metric_is_the_same_however_rows_are_batched(kind):
    """The metrics of 12 rows fed as one batch, batches of 5, or one row at a time."""
    g = torch.Generator().manual_seed(0)
    n = 12
    if kind == "ad_relevance":
        task = make_task(task_cfg(kind, label_type="graded"))
        logits = torch.randn(n, 1, generator=g)
        batch = {"target": torch.randint(0, 3, (n,), generator=g) / 2,
                 "group": torch.arange(n) // 4}  # fmt: skip
    elif kind == "seq_classification":
        task = make_task(task_cfg(kind, labels=["a", "b", "c"]))
        logits = torch.randn(n, 3, generator=g)
        batch = {"label": torch.randint(0, 3, (n,), generator=g)}
    else:
        task = make_task(task_cfg(kind, target_mean=1.0, target_std=2.0))
        logits = torch.randn(n, 1, generator=g)
        batch = {"target": torch.randn(n, generator=g)}
    whole = computed(task, logits, batch)
    for size in (5, 1):
        metrics = task.metrics()
        for i in range(0, n, size):
            task.update(
                metrics, logits[i : i + size], {k: v[i : i + size] for k, v in batch.items()}
            )
        assert task.compute(metrics) == pytest.approx(whole, abs=1e-6), size
    if kind == "regression":
        pred, t = logits[:, 0] * 2 + 1, batch["target"]
        assert whole["spearman"] == pytest.approx(stats.spearmanr(pred, t).statistic, abs=1e-6)


def test_a_monitor_the_task_does_not_report_is_named(tmp_path):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(20))
    task = make_task(cfg_for("seq_classification", train, monitor="accuracy"))
    with pytest.raises(UserError) as e:
        load_splits(task, 0)
    assert str(e.value) == (
        "task.monitor='accuracy': not a metric of this task; expected one of "
        "['acc', 'f1', 'mcc', 'loss']"
    )
    load_splits(make_task(cfg_for("seq_classification", train, monitor="loss", mode="min")), 0)


# ---------------------------------------------------------------- sweep: tables written


@pytest.mark.parametrize("name", ["out.csv", "out.tsv", "out.jsonl", "out.parquet"])
def test_a_written_table_reads_back_equal(tmp_path, name):
    """What `score` writes (its input with a score column) reads back cell for cell: quotes,
    commas, line breaks (a bare CR too, in a first or last cell: CSV dropped it, or wrote a
    file its reader refused), a leading BOM-like character, non-ASCII text, a score's every
    digit."""
    texts = ['say "hi"', "a, b", "two\nlines", "\ufeffmark", "café", '"quoted"', "x\r", "\r"]
    texts += ["a\rb", "crlf\r\n"]
    if name.endswith(".tsv"):
        texts = [t for t in texts if not set(t) & {"\n", "\r"}]
    scores = [0.1234567890123456789 * (i + 1) for i in range(len(texts))]
    df = pd.DataFrame({"query": texts, "score": scores, "ad": texts[::-1]})
    path = tmp_path / name
    write_table(df, path)
    back = read_table(path)
    assert back["query"].tolist() == texts and back["ad"].tolist() == texts[::-1]
    assert [float(v) for v in back["score"]] == scores


def test_a_tsv_cell_that_tsv_cannot_hold_is_named(tmp_path):
    """TSV has no quoting (it is read with none): a tab or line break in a cell is refused,
    naming the row and column, never written quoted to be read back with its quotes."""
    df = pd.DataFrame({"query": ["ok", "a\tb"], "score": [0.5, 0.25]})
    with pytest.raises(DataError) as e:
        write_table(df, tmp_path / "out.tsv")
    assert str(e.value) == (
        f"{tmp_path / 'out.tsv'}: row 2, column 'query': a tab or line break, which TSV "
        "cannot hold; write .csv, .jsonl or .parquet"
    )
    assert not (tmp_path / "out.tsv").exists()


# ---------------------------------------------------------------- sweep: what is held out


def test_a_query_written_two_ways_stays_on_one_side(tmp_path):
    """Case and spacing variants of a query are one group: never on two sides of a split."""
    rows = []
    for q in range(30):
        for i, form in enumerate([f"query {q}", f"Query  {q}", f" QUERY {q} "]):
            rows.append({"query": form, "ad": f"ad {i}", "label": i % 2})
    train = write_csv(tmp_path / "ads.csv", rows)
    _, tables = load_splits(make_task(cfg_for("ad_relevance", train)), 0)
    sides = {}
    for k, t in tables.items():
        for text in t["text"]:
            sides.setdefault(" ".join(text.lower().split()), set()).add(k)
    assert all(len(s) == 1 for s in sides.values())
    assert sum(len(t["text"]) for t in tables.values()) == 90


def test_target_scale_is_fitted_on_the_train_part_only(tmp_path):
    """A regression's mean and std come from the rows it trains on, not from the validation
    and test rows cut from the same file."""
    rows = regression_rows(40)
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    completed, tables = load_splits(make_task(cfg_for("regression", train)), 0)
    t = torch.tensor(tables["train"]["target"])
    assert len(t) < 40
    assert completed.cfg.target_mean == pytest.approx(float(t.mean()))
    assert completed.cfg.target_std == pytest.approx(float(t.std()))


# ---------------------------------------------------------------- trial: what is recorded is used


@pytest.mark.parametrize("given", [{"target_std": 5.0}, {"target_mean": 2.0}])
def test_a_half_given_target_scale_keeps_the_given_one(tmp_path, given):
    """`task.target_std=5` alone was replaced by the learnt std (the run recorded 5); a mean
    alone crashed at the first step. The given one is used, the other learnt from the rows
    trained on."""
    train = write_jsonl(tmp_path / "train.jsonl", regression_rows(40))
    learnt, _ = load_splits(make_task(cfg_for("regression", train)), 0)
    task, _ = load_splits(make_task(cfg_for("regression", train, **given)), 0)
    c, fitted = task.cfg, learnt.cfg
    want = {"target_mean": fitted.target_mean, "target_std": fitted.target_std} | given
    assert {"target_mean": c.target_mean, "target_std": c.target_std} == want
    assert task.scores(torch.ones(1, 1)).item() == pytest.approx(c.target_mean + c.target_std)


@pytest.mark.parametrize("std", [0.0, -5.0])
def test_a_target_std_not_above_zero_is_refused(std):
    with pytest.raises(UserError) as e:
        make_task(task_cfg("regression", target_std=std))
    assert str(e.value) == (
        f"task.target_std={std}: expected a number above 0 (null: learnt from the rows trained on)"
    )


def mode_cases():
    """(kind, monitor, its direction) for every metric each task reports, and the loss."""
    lower = {"loss", "mse", "mae"}
    reported = {
        "seq_classification": ["acc", "f1", "mcc"],
        "regression": ["mse", "mae", "pearson", "spearman"],
        "ad_relevance": ["auroc", "acc", "f1", "spearman", "ndcg@10"],
        "token_classification": ["precision", "recall", "f1"],
    }
    for kind, names in reported.items():
        for m in [*names, "loss"]:
            yield kind, m, "min" if m in lower else "max"


def train_file_of(kind: str, tmp_path):
    if kind == "token_classification":
        return write_conll(tmp_path / "train.conll")
    if kind == "ad_relevance":
        return write_csv(tmp_path / "ads.csv", ad_rows(10))
    rows = regression_rows(40) if kind == "regression" else sentiment_rows(40)
    return write_jsonl(tmp_path / "train.jsonl", rows)


@pytest.mark.parametrize("kind, monitor, mode", list(mode_cases()))
def test_a_mode_against_the_monitor_is_refused(tmp_path, kind, monitor, mode):
    """`task.monitor=pearson` kept regression's `mode: min` (the worst checkpoint kept, early
    stopping on improvement), `monitor=loss` a classifier's `max`: each metric has one
    direction, and a mode against it is one line naming both keys."""
    train = train_file_of(kind, tmp_path)
    extra = {"label_type": "graded", "graded_to": "threshold"} if kind == "ad_relevance" else {}
    load_splits(make_task(cfg_for(kind, train, monitor=monitor, mode=mode, **extra)), 0)
    wrong = {"min": "max", "max": "min"}[mode]
    with pytest.raises(UserError) as e:
        load_splits(make_task(cfg_for(kind, train, monitor=monitor, mode=wrong, **extra)), 0)
    better = "lower" if mode == "min" else "higher"
    assert str(e.value) == (
        f"task.mode={wrong} contradicts task.monitor={monitor} ({better} is better): "
        f"give task.mode={mode}"
    )


def variant_rows(kind: str) -> list[dict]:
    """Four spellings of each of 30 groups that an uncased tokenizer reads as one (case,
    spacing, accents composed or not, spaces around punctuation), in the group column `book`."""
    rows = []
    for g in range(30):
        forms = [f"Café Book.{g}", f"cafe\u0301  book . {g} ", f"CAFÉ BOOK .{g}", f"CAFE book. {g}"]
        for i, form in enumerate(forms):
            text = {"query": f"query {g} {i}", "ad": f"ad {i}"}
            if kind == "seq_classification":
                text = {"sentence": f"the text {g} {i}"}
            rows.append(text | {"book": form, "label": i % 2})
    return rows


def test_group_keys_part_only_what_the_tokenizer_reads_apart():
    """One group for spellings BERT's uncased tokenizer reads as one (CJK with or without
    spaces, control characters, accents composed or not); two where it reads two tokens
    (`A-1`/`A1`, `C++`/`C`, `m²`/`m2`, full-width digits, ligatures)."""
    norm = normalizers.BertNormalizer(strip_accents=True, lowercase=True)  # _bert_tokenizer's
    words = lambda t: [w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(t)]
    same = [("东京大学", "东京 大学"), ("a\x07b", "ab"), ("Café", "cafe\u0301"), ("x ,y", "x, y")]
    same += [("café\ufffd menu", "café menu"), ("page\x0cbreak", "pagebreak"), ("ΟΔΟΣ", "οδοσ")]
    same += [("a\U0002b920b", "a \U0002b920 b")]
    apart = [("A-1", "A1"), ("C++", "C"), ("m²", "m2"), ("１２", "12"), ("ﬁle", "file")]
    apart += [("page\x0cbreak", "page break")]
    for a, b in same + apart:
        read_as_one = words(norm.normalize_str(a)) == words(norm.normalize_str(b))
        assert (group_keys([a])[0] == group_keys([b])[0]) == read_as_one == ((a, b) in same)


@pytest.mark.parametrize("kind", ["ad_relevance", "seq_classification"])
def test_an_explicit_group_column_is_read_as_the_tokenizer_reads_it(tmp_path, kind):
    """`task.group_column` (ad_relevance's own `query` too) compared its values as written:
    `Book 1` and `book 1 ` were two groups, and so were `café` composed and decomposed, on both
    sides of a split and of the cross-file check. One group key for every grouping: case,
    spacing, accents and the spaces around punctuation aside."""
    train = write_csv(tmp_path / "train.csv", variant_rows(kind))
    _, tables = load_splits(make_task(cfg_for(kind, train, group_column="book")), 0)
    sides = {}
    for k, t in tables.items():
        for g in t["group"]:
            sides.setdefault(g, set()).add(k)
    assert len(sides) == 30 and all(len(s) == 1 for s in sides.values())
    dev = write_csv(tmp_path / "dev.csv", variant_rows(kind)[:1])
    dev.write_text(dev.read_text().replace("Café Book.0", " CAFE\u0301 BOOK . 0"))
    task = make_task(cfg_for(kind, train, group_column="book", validation_file=str(dev)))
    with pytest.raises(
        DataError, match=r"1 of its 1 .* are also in .* \(e\.g\. 'cafe book \. 0'\)"
    ):
        load_splits(task, 0)
    if kind == "ad_relevance":
        rows = variant_rows(kind)
        for r in rows:
            r["query"] = r["book"]
        ads = write_csv(tmp_path / "ads.csv", rows)
        _, tables = load_splits(make_task(cfg_for(kind, ads, group_column="query")), 0)
        sides = {}
        for k, t in tables.items():
            for key in group_keys(t["text"]):
                sides.setdefault(key, set()).add(k)
        assert len(sides) == 30 and all(len(s) == 1 for s in sides.values())


def test_a_nullable_parquet_columns_missing_cells_are_missing(tmp_path):
    """pandas' nullable dtypes (`convert_dtypes()`) write a missing cell that reads back as
    `pd.NA` (a time's as `NaT`): a missing text, refused as the object dtype's None is, never
    the text `<NA>`; a missing group, the empty key."""
    frame = pd.DataFrame({"text": ["a", None, "c"], "group": ["x", None, "y"]}).convert_dtypes()
    frame.to_parquet(tmp_path / "t.parquet")
    df = read_table(tmp_path / "t.parquet")
    assert group_keys(df["group"].tolist()) == ["x", "", "y"]
    assert group_keys([pd.NaT]) == [""]
    with pytest.raises(DataError, match=r"row 2, column 'text': missing text"):
        text_values(df["text"].tolist(), tmp_path / "t.parquet", "text")


def test_json_labels_of_one_number_are_one_class(tmp_path):
    """A JSON label column holding `1`, `1.0` and `0` learnt the classes '0', '1', '1.0': an
    integral number is one class however written; booleans are classes of their own
    (`True`, `False`), refused among numbers (which class a `true` is would be a guess)."""
    rows = sentiment_rows(12)
    for r, label in zip(rows, [1, 1.0, 0, 0.0] * 3, strict=True):
        r["label"] = label
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    task, tables = load_splits(make_task(cfg_for("seq_classification", train)), 0)
    assert task.cfg.labels == ["0", "1"]
    rows[5]["label"] = True
    mixed = write_jsonl(tmp_path / "mixed.jsonl", rows)
    with pytest.raises(DataError) as e:
        load_splits(make_task(cfg_for("seq_classification", mixed)), 0)
    assert str(e.value) == (
        f"{mixed}: row 6, column 'label': True, a JSON boolean among numbers; write every "
        "label of the column as a number or every one as true/false"
    )
    for r in rows:
        r["label"] = bool(r["label"])
    flags = write_jsonl(tmp_path / "flags.jsonl", rows)
    task, _ = load_splits(make_task(cfg_for("seq_classification", flags)), 0)
    assert task.cfg.labels == ["False", "True"]


def test_a_grouped_split_far_from_its_shares_is_said(caplog):
    """One group of 160 of 200 rows: a part took it whole and training got a few rows, with
    nothing said. A part off its asked share by more than half of it is one warning naming the
    shares asked and got; equal groups are silent."""
    groups = ["big"] * 160 + [f"g{i}" for i in range(40)]
    with caplog.at_level(logging.WARNING):
        parts = grouped_split(groups, {"validation": 0.1, "test": 0.1}, seed=0)
    got = {k: len(v) / 200 for k, v in parts.items()}
    assert max(got.values()) == 0.8 and got["train"] != 0.8
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    shares = ", ".join(f"{k} {got[k]:.3f}" for k in ("validation", "test", "train"))
    assert said == [
        f"a split by whole groups gives {shares} of the 200 rows; asked validation 0.100, "
        "test 0.100, train 0.800 (the largest group holds 160 rows)"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        grouped_split([f"g{i}" for i in range(200)], {"validation": 0.1, "test": 0.1}, seed=0)
    assert not caplog.records


def test_held_out_rows_copying_training_rows_are_said(tmp_path, caplog):
    """Exact copies of training texts among the validation or test rows (1% of SST-2's
    validation rows): one warning with their count and an example, never a refusal."""
    rows = [{"sentence": f"text {i}", "label": i % 2} for i in range(20)]
    train = write_csv(tmp_path / "train.csv", rows)
    dev = write_csv(tmp_path / "dev.csv", rows[3:5] + [{"sentence": "new", "label": 0}])
    task = make_task(cfg_for("seq_classification", train, validation_file=str(dev)))
    with caplog.at_level(logging.WARNING):
        _, tables = load_splits(task, 0)
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    n = len(tables["test"]["text"])
    assert said == [
        f"validation 2 of 3 rows, test 0 of {n} rows have the text of a training row, "
        "e.g. 'text 3': their scores read rows trained on"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        load_splits(make_task(cfg_for("seq_classification", train)), 0)
    assert not caplog.records
