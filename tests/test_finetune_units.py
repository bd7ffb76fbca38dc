"""Metrics against hand-computed values, label alignment, splits and bad input: no training."""

import math
import random
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import bert_lightning
from bert_lightning.data.tables import (
    DataError,
    GroupBatchSampler,
    collate,
    grouped_split,
    grouped_subsample,
)
from bert_lightning.errors import UserError
from bert_lightning.interop import ours_to_hf
from bert_lightning.model.heads import (
    BertBiEncoder,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from bert_lightning.tasks.ad_relevance import lambda_weights, listwise_loss
from bert_lightning.tasks.classification import bio_spans
from bert_lightning.tasks.kinds import load_splits, make_task, pairwise_loss
from bert_lightning.tasks.ranking import ndcg
from finetune_fixtures import (
    cfg_for,
    computed,
    regression_rows,
    sentiment_rows,
    task_cfg,
    tiny_config,
    write_conll,
    write_csv,
    write_jsonl,
    write_tokenizer,
)


def test_seq_classification_metrics_by_hand():
    task = make_task(task_cfg("seq_classification", labels=["0", "1"]))
    pred, label = torch.tensor([1, 0, 1, 1, 0, 0]), torch.tensor([1, 0, 0, 1, 1, 0])
    got = computed(task, torch.nn.functional.one_hot(pred, 2).float(), {"label": label})
    tp, fp, fn, tn = 2, 1, 1, 2
    mcc = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert got == pytest.approx({"acc": 4 / 6, "f1": 2 * tp / (2 * tp + fp + fn), "mcc": mcc})
    constant = computed(task, torch.tensor([[0.0, 1.0]] * 6), {"label": label})
    assert constant["mcc"] == 0 and constant["acc"] == pytest.approx(3 / 6)  # as GLUE, sklearn


def test_regression_metrics_by_hand_on_the_original_scale():
    task = make_task(task_cfg("regression", target_mean=10.0, target_std=2.0))
    pred, target = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([2.0, 2.0, 5.0, 3.0])
    got = computed(task, ((pred - 10) / 2)[:, None], {"target": target})
    # Pearson: dx = (-1.5, -.5, .5, 1.5), dy = (-1, -1, 2, 0); Spearman: y ranks (1.5, 1.5, 4, 3)
    assert got == pytest.approx(
        {"mse": 1.5, "mae": 1.0, "pearson": 3 / math.sqrt(30), "spearman": 3.5 / math.sqrt(22.5)}
    )
    assert task.loss(((target - 10) / 2)[:, None], {"target": target}) == 0


def test_ad_relevance_metrics_by_hand():
    task = make_task(task_cfg("ad_relevance", label_type="graded"))
    score = torch.tensor([0.9, 0.6, 0.2, 0.3, 0.8])
    batch = {
        "target": torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0]),
        "group": torch.tensor([0, 0, 0, 1, 1]),
    }
    got = computed(task, torch.logit(score)[:, None], batch)
    # relevant (t >= 0.5): 1 0 1 0 1; predicted (s >= 0.5): 1 1 0 0 1
    # AUROC: of the 6 (positive, negative) pairs, 4 are ordered right
    # NDCG@10 (gain = relevance): query 0 ranks t = 1, 0, .5 (ideal 1, .5, 0); query 1 is ideal
    ndcg0 = (1 + 0.5 / math.log2(4)) / (1 + 0.5 / math.log2(3))
    # graded: threshold-free metrics only (no accuracy or F1 at a score of 0.5)
    assert got == pytest.approx(
        {"auroc": 4 / 6, "spearman": 6 / math.sqrt(90), "ndcg@10": (ndcg0 + 1.0) / 2}, abs=1e-6
    )
    binary = make_task(task_cfg("ad_relevance", label_type="binary"))
    batch["target"] = (batch["target"] >= 0.5).float()
    got = computed(binary, torch.logit(score)[:, None], batch)
    assert sorted(got) == ["acc", "auroc", "f1", "ndcg@10"]
    assert (got["acc"], got["f1"]) == pytest.approx((3 / 5, 2 * 2 / (2 * 2 + 1 + 1)))


def test_pairwise_loss_by_hand():
    s, t, g = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1])
    # one pair within a query: (0, 1), score difference 2; row 2 is alone in its query
    assert pairwise_loss(s, t, g, "logistic", 1.0) == pytest.approx(math.log1p(math.exp(-2)))
    assert pairwise_loss(s, t, g, "margin", 3.0) == pytest.approx(1.0)
    assert pairwise_loss(s, t, torch.tensor([0, 1, 2]), "logistic", 1.0) == 0
    # pairs=batch: also across queries, (0, 1) (0, 2) (2, 1) with differences 2, 1, 1
    task = make_task(task_cfg("ad_relevance", loss="pairwise", pairs="batch"))
    want = (math.log1p(math.exp(-2)) + 2 * math.log1p(math.exp(-1))) / 3
    assert task.loss(s[:, None], {"target": t, "group": g}) == pytest.approx(want)


def test_listwise_loss_by_hand():
    """Query 0: targets (1, 0) give p = (1, 0), so -log softmax(2, 0)_0 = log(1 + e^-2); query
    1 is one row (log softmax 0); a query with no target above 0 does not count."""
    s, t, g = torch.tensor([2.0, 0.0, 1.0]), torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1])
    assert listwise_loss(s, t, g) == pytest.approx(math.log1p(math.exp(-2)) / 2)
    assert listwise_loss(s, torch.tensor([1.0, 0.0, 0.0]), g) == pytest.approx(
        math.log1p(math.exp(-2))
    )
    p = torch.tensor([0.5, 0.25, 0.25])  # targets (1, .5, .5) of one query
    want = -(p * torch.log_softmax(s, 0)).sum()
    assert listwise_loss(s, torch.tensor([1.0, 0.5, 0.5]), torch.zeros(3)) == pytest.approx(want)
    assert listwise_loss(s, torch.zeros(3), g) == 0
    task = make_task(task_cfg("ad_relevance", loss="pointwise+listwise", pairwise_weight=2.0))
    bce = torch.nn.functional.binary_cross_entropy_with_logits(s, t)
    got = task.loss(s[:, None], {"target": t, "group": g})
    assert got == pytest.approx(bce + math.log1p(math.exp(-2)))
    assert task.grouped_batches


def test_lambda_weights_are_the_ndcg_change_of_a_swap():
    """Each pair's weight is what swapping the two rows' scores does to the query's NDCG
    (tasks/ranking.ndcg, computed apart); the loss is the weighted mean of the logistic term."""
    s = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.7])
    t = torch.tensor([1.0, 0.0, 0.5, 0.5, 1.0])
    g = torch.tensor([0, 0, 0, 1, 1])
    w = lambda_weights(s, t, g)
    for i in range(5):
        for j in range(5):
            if g[i] != g[j]:
                assert w[i, j] == 0
                continue
            rows = (g == g[i]).nonzero()[:, 0]
            swapped = s.clone()
            swapped[[i, j]] = s[[j, i]]
            change = ndcg(swapped[rows].numpy(), t[rows].numpy(), 10) - ndcg(
                s[rows].numpy(), t[rows].numpy(), 10
            )
            assert float(w[i, j]) == pytest.approx(abs(change), abs=1e-6)
    pairs = (g[:, None] == g[None, :]) & (t[:, None] > t[None, :])
    diff = (s[:, None] - s[None, :])[pairs]
    want = (w[pairs] * torch.nn.functional.softplus(-diff)).sum() / w[pairs].sum()
    assert pairwise_loss(s, t, g, "lambda", 1.0) == pytest.approx(float(want))


def test_pointwise_plus_pairwise_is_the_weighted_sum():
    s, t, g = torch.tensor([2.0, 0.0, -1.0]), torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1])
    parts = [
        make_task(task_cfg("ad_relevance", label_type="graded", loss=kind))
        for kind in ("pointwise", "pairwise", "pointwise+pairwise")
    ]
    point, pair, both = (p.loss(s[:, None], {"target": t, "group": g}) for p in parts)
    assert pair == pytest.approx(math.log1p(math.exp(-2)))  # the one pair of query 0
    assert both == pytest.approx(point + pair)
    weighted = make_task(task_cfg("ad_relevance", loss="pointwise+pairwise", pairwise_weight=3.0))
    assert weighted.loss(s[:, None], {"target": t, "group": g}) == pytest.approx(point + 3 * pair)
    assert [p.grouped_batches for p in parts] == [False, True, True]
    with pytest.raises(UserError, match=r"task.loss='rankwise'; expected one of \("):
        make_task(task_cfg("ad_relevance", loss="rankwise"))  # refused before any step


def test_in_batch_contrastive_loss_by_hand_and_in_any_row_order():
    """Query 0: an ad of target 1 and one of 0; query 1: two ads of target 1. The positives
    (rows 0, 2, 3) each hold their query against the batch's ads, the other ads of their query
    at least as relevant left out (row 3 for row 2, row 2 for row 3)."""
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g)
    t, group = torch.tensor([1.0, 0.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1])
    cos = lambda i, j: float(torch.nn.functional.cosine_similarity(u[i], v[j], dim=0))
    want = 0.0
    for i, candidates in ((0, [0, 1, 2, 3]), (2, [0, 1, 2]), (3, [0, 1, 3])):
        want -= 5 * cos(i, i) - math.log(sum(math.exp(5 * cos(i, j)) for j in candidates))
    task = make_task(task_cfg("ad_relevance", label_type="graded", architecture="bi_encoder",
                              contrastive_weight=2.0, contrastive_scale=5.0))  # fmt: skip
    s = torch.zeros(4, 1)  # logits of 0: BCE log 2 a row
    batch = {"target": t, "group": group}
    assert task.loss(s, batch, (u, v)) == pytest.approx(math.log(2) + 2 * want / 3, rel=1e-5)
    perm = torch.tensor([3, 1, 0, 2])
    shuffled = {"target": t[perm], "group": group[perm]}
    assert task.loss(s, shuffled, (u[perm], v[perm])) == pytest.approx(
        float(task.loss(s, batch, (u, v))), rel=1e-6
    )
    # no row at or above contrastive_min: nothing to contrast
    none = {"target": torch.zeros(4), "group": group}
    assert task.loss(s, none, (u, v)) == pytest.approx(math.log(2))
    with pytest.raises(
        UserError, match=r"^task.contrastive_weight=1.0 needs task.architecture=bi_encoder"
    ):
        make_task(task_cfg("ad_relevance", contrastive_weight=1.0))


def test_pointwise_loss_is_bce_on_the_score():
    task = make_task(task_cfg("ad_relevance", label_type="graded"))
    s, t = torch.tensor([0.8, 0.1]), torch.tensor([1.0, 0.5])
    want = -(math.log(0.8) + 0.5 * math.log(0.1) + 0.5 * math.log(0.9)) / 2
    assert task.loss(torch.logit(s)[:, None], {"target": t}) == pytest.approx(want, rel=1e-5)


def test_group_batches_hold_whole_groups():
    groups = [i % 7 for i in range(40)]
    sampler = GroupBatchSampler(groups, batch_size=8, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(sum(batches, [])) == list(range(40))
    for b in batches:
        for g in {groups[i] for i in b}:
            assert sum(groups[i] == g for i in b) == groups.count(g)
    assert list(sampler) != batches  # a new order each epoch


def test_bio_spans_follow_conlleval():
    tags = ["I-PER", "I-PER", "O", "B-LOC", "I-PER", "B-LOC", "I-LOC"]
    assert bio_spans(tags) == {(0, 2, "PER"), (3, 4, "LOC"), (4, 5, "PER"), (5, 7, "LOC")}


def test_entity_f1_by_hand():
    labels = ["O", "B-person", "I-person", "B-location"]
    task = make_task(task_cfg("token_classification", labels=labels))
    # sentence 1: gold B-per I-per O B-loc, predicted B-per O O B-loc -> 1 of 2 right
    # sentence 2: gold O B-loc B-per, predicted B-loc B-loc and the third word truncated (O)
    pred_words = [[1, 0, 0, 3], [3, 3]]
    first = torch.tensor([[1, 2, 3, 4], [1, 2, -1, -1]])
    logits = torch.zeros(2, 6, 4)
    for b, words in enumerate(pred_words):
        for w, lab in enumerate(words):
            logits[b, first[b, w], lab] = 1.0
    batch = {"first_piece": first, "word_labels": torch.tensor([[1, 2, 0, 3], [0, 3, 1, -100]])}
    got = computed(task, logits, batch)
    assert got == pytest.approx({"precision": 2 / 4, "recall": 2 / 4, "f1": 0.5})


def test_labels_sit_on_the_first_word_piece(tmp_path):
    tok = write_tokenizer(tmp_path / "tok.json")
    task = make_task(task_cfg("token_classification", labels=["O", "B-x", "I-x"]))
    words = ["bob", "unlovelyness", "paris", "greatgood"]
    table = {"words": [words], "label": [[1, 2, 0, 1]]}
    (f,) = task.encode(table, tok, 64)
    tokens = [tok.id_to_token(i) for i in f["input_ids"]]
    assert len(tokens) > len(words) + 2  # some words are split into several pieces
    starts = [
        i for i, t in enumerate(tokens) if not t.startswith("##") and t not in ("[CLS]", "[SEP]")
    ]
    assert f["first_piece"] == starts
    assert [f["token_labels"][i] for i in starts] == [1, 2, 0, 1]
    assert sum(lab != -100 for lab in f["token_labels"]) == 4
    (cut,) = task.encode(table, tok, 4)  # [CLS] two pieces [SEP]: later words lose their label
    assert cut["first_piece"][2:] == [-1, -1] and len(cut["input_ids"]) == 4
    batch = collate([f, cut], pad_id=0)
    assert batch["token_labels"].shape == batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["attention_mask"][1].tolist() == [1] * 4 + [0] * (len(tokens) - 4)


def test_grouped_split_keeps_groups_together_and_is_seeded():
    groups = [f"q{i % 37}" for i in range(500)]
    parts = grouped_split(groups, {"validation": 0.1, "test": 0.2}, seed=3)
    assert sorted(sum(parts.values(), [])) == list(range(500))
    seen = [{groups[i] for i in rows} for rows in parts.values()]
    assert all(not (a & b) for i, a in enumerate(seen) for b in seen[i + 1 :])
    assert abs(len(parts["validation"]) - 50) <= 14 and abs(len(parts["test"]) - 100) <= 14
    assert parts == grouped_split(groups, {"validation": 0.1, "test": 0.2}, seed=3)
    assert parts != grouped_split(groups, {"validation": 0.1, "test": 0.2}, seed=4)


@pytest.mark.parametrize("n_groups", [37, 500])  # queries of ~14 rows; one row per group
def test_subsample_takes_exactly_n_rows_seeded(n_groups):
    groups = [f"q{i % n_groups}" for i in range(500)]
    kept = grouped_subsample(groups, 100, seed=0)
    assert len(kept) == len(set(kept)) == 100
    assert kept == grouped_subsample(groups, 100, seed=0)
    assert kept != grouped_subsample(groups, 100, seed=1)
    counts = {g: sum(groups[i] == g for i in kept) for g in {groups[i] for i in kept}}
    assert sum(c < groups.count(g) for g, c in counts.items()) <= 1  # whole groups but the last
    assert grouped_subsample(groups, None, seed=0) == grouped_subsample(groups, 600, seed=0)


@pytest.mark.parametrize("n", [-3, 0, 2.5])
def test_a_subsample_of_no_rows_or_a_negative_count_is_one_line(tmp_path, n):
    """`task.subsample.train=-3` kept 2 of 15 rows, silently (a slice from the end); 0 named
    task.split as its fix."""
    rows = [{"sentence": f"s{i}", "label": i % 2} for i in range(15)]
    train = write_csv(tmp_path / "train.csv", rows)
    cfg = cfg_for("seq_classification", train)
    with pytest.raises(UserError) as e:
        load_splits(make_task(cfg | {"subsample": {**cfg["subsample"], "train": n}}), 0)
    assert str(e.value) == f"task.subsample.train={n!r}; expected a row count >= 1, or null"


def test_heads_map_onto_transformers_by_key():
    transformers = pytest.importorskip("transformers")
    config = tiny_config(50)
    hf_cfg = transformers.BertConfig(
        **{k: v for k, v in config.to_dict().items() if k != "pre_layer_norm"}, num_labels=3
    )
    ids = torch.randint(5, 50, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    for ours, name in (
        (BertForSequenceClassification(config, 3, "cls"), "BertForSequenceClassification"),
        (BertForTokenClassification(config, 3), "BertForTokenClassification"),
    ):
        ours = ours.eval()
        hf = getattr(transformers, name)(hf_cfg).eval()
        missing, unexpected = hf.load_state_dict(ours_to_hf(ours.state_dict()), strict=False)
        assert not unexpected and all("position_ids" in k for k in missing)
        with torch.no_grad():
            a, b = ours(ids, None, mask), hf(ids, attention_mask=mask).logits
        real = mask.bool() if a.dim() == 3 else slice(None)  # pads: ours computes none
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)


def test_mean_and_max_pooling_read_real_tokens_only():
    """Padding changes neither pooling; each equals the formula over the last layer's real rows
    (eval mode, so the classifier's dropout is off)."""
    config = tiny_config(50)
    ids = torch.randint(5, 50, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    for pooling, reduce in (("mean", lambda h: h.mean(0)), ("max", lambda h: h.amax(0))):
        torch.manual_seed(0)
        model = BertForSequenceClassification(config, 3, pooling).eval()
        assert model.bert.pooler is None  # nothing untrained rides along (DDP, export)
        with torch.no_grad():
            logits = model(ids, None, mask)  # (2, 3)
            h = model.bert(ids[1:, :4]).last_hidden_state[0]  # (4, H): the real tokens alone
            torch.testing.assert_close(logits[1], model.classifier(reduce(h)), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="task.pooling='last'; expected one of"):
        BertForSequenceClassification(config, 3, "last")


def test_missing_column_is_named_with_the_key_that_names_another(tmp_path):
    train = write_csv(tmp_path / "train.csv", [{"text": "a", "label": 1}])
    with pytest.raises(DataError) as e:
        load_splits(make_task(cfg_for("seq_classification", train)), 0)
    assert str(e.value) == (
        f"{train}: no column 'sentence'; the file has ['text', 'label']: "
        "task.text_column=NAME reads another"
    )


def test_label_outside_the_label_set_names_file_row_column(tmp_path):
    rows = sentiment_rows(20)
    rows[2]["label"] = 2
    train = write_csv(tmp_path / "train.csv", rows)
    task = make_task(cfg_for("seq_classification", train, labels=["0", "1"]))
    with pytest.raises(DataError, match=r"train\.csv: row 3, column 'label': label '2' is not in"):
        load_splits(task, 0)
    train = write_csv(tmp_path / "ok.csv", sentiment_rows(20))
    dev = write_csv(tmp_path / "dev.csv", rows)  # a label the train file never had
    task = make_task(cfg_for("seq_classification", train, validation_file=str(dev)))
    with pytest.raises(DataError, match=r"dev\.csv: row 3, column 'label'"):
        load_splits(task, 0)
    conll = write_conll(tmp_path / "train.conll")
    dev = tmp_path / "dev.conll"
    dev.write_text("bob\tB-person\nzed\tB-planet\n")
    task = make_task(cfg_for("token_classification", conll, validation_file=str(dev)))
    with pytest.raises(DataError, match=r"dev\.conll: line 2, column 'tag': label 'B-planet'"):
        load_splits(task, 0)
    ads = write_csv(tmp_path / "ads.csv", [{"query": "q", "ad": "a", "label": 5}])
    task = make_task(cfg_for("ad_relevance", ads, label_type="graded"))
    with pytest.raises(
        DataError, match=r"ads\.csv: row 1, column 'label': label 5.0 is not a grade"
    ):
        load_splits(task, 0)


@pytest.mark.parametrize("name", ["empty.csv", "header_only.csv", "empty.conll", "empty.jsonl"])
def test_empty_file_is_named(tmp_path, name):
    path = tmp_path / name
    path.write_text("sentence,label\n" if name == "header_only.csv" else "")
    task = "token_classification" if name.endswith(".conll") else "seq_classification"
    with pytest.raises(DataError, match=rf"{name.replace('.', '[.]')}: empty file"):
        load_splits(make_task(cfg_for(task, path)), 0)


@pytest.mark.parametrize("bad", ["nan", "", None])
def test_nan_target_names_file_row_column(tmp_path, bad):
    rows = regression_rows(10)
    rows[4]["target"] = bad
    if bad is None:
        train = write_jsonl(tmp_path / "train.jsonl", rows)
    else:
        train = write_csv(tmp_path / "train.csv", rows)
    with pytest.raises(
        DataError, match=rf"{train.name}: row 5, column 'target': .* not a finite number"
    ):
        load_splits(make_task(cfg_for("regression", train)), 0)


def test_single_file_split_keeps_queries_apart(tmp_path):
    rows = [{"query": f"q{i % 20}", "ad": f"ad {i}", "label": i % 2} for i in range(200)]
    train = write_csv(tmp_path / "ads.csv", rows)
    _, tables = load_splits(make_task(cfg_for("ad_relevance", train)), 0)
    queries = {k: set(t["text"]) for k, t in tables.items()}
    assert not (queries["train"] & queries["validation"]) and not (
        queries["train"] & queries["test"]
    )
    assert sum(len(t["text"]) for t in tables.values()) == 200


def test_the_bi_encoder_alone_pools_with_mean():
    """`task.architecture=bi_encoder` alone starts from the zero-shot ranking (mean pooling, as
    its docstring says); the cross-encoder keeps BERT's pooled [CLS]; a pooling given stays.
    The checkpoint stores the pooling built, so resuming and scoring read the same."""
    built = lambda **kw: make_task(task_cfg("ad_relevance", **kw))
    bi = built(architecture="bi_encoder")
    model = bi.build_model(tiny_config(50))
    assert isinstance(model, BertBiEncoder) and model.pooling == "mean"
    assert asdict(bi.cfg)["pooling"] == "mean"
    assert built().build_model(tiny_config(50)).pooling == "cls"
    assert built(architecture="bi_encoder", pooling="max").cfg.pooling == "max"


@pytest.mark.parametrize(
    "kind, allowed",
    [
        ("seq_classification", "('cls', 'mean', 'max')"),
        ("ad_relevance", "('cls', 'mean', 'max', None)"),
    ],
)
def test_a_bad_pooling_is_one_line_when_the_config_is_read(tmp_path, kind, allowed):
    """Refused by `make_task`, before any file is read (the train file here does not exist),
    never by a model that would fail later; a bi-encoder built by hand refuses it too."""
    want = f"task.pooling='last4'; expected one of {allowed}"
    with pytest.raises(UserError) as e:
        make_task(task_cfg(kind, pooling="last4", train_file=str(tmp_path / "missing.csv")))
    assert str(e.value) == want
    for bad in ("last4", "sum"):
        with pytest.raises(UserError, match=rf"^task.pooling='{bad}'; expected one of \('cls'"):
            BertBiEncoder(tiny_config(50), bad)


def test_a_config_value_outside_its_choices_or_a_missing_key_is_named():
    with pytest.raises(UserError, match=r"^task.architecture='bi'; expected one of \("):
        make_task(task_cfg("ad_relevance", architecture="bi"))
    with pytest.raises(UserError, match=r"^task.mode='maximum'; expected one of \('min', 'max'\)"):
        make_task(task_cfg("regression", mode="maximum"))
    older = {k: v for k, v in task_cfg("ad_relevance").items() if k != "pairs"}
    with pytest.raises(UserError, match=r"^task: missing key\(s\) \['pairs'\]$"):
        make_task(older)  # a config older than the key: named, never a default in code


def test_fit_returns_what_the_train_file_fixes_and_changes_nothing(tmp_path):
    """`fit` learns; `load_splits` returns the task completed with it, the given one as it was."""
    train = write_csv(tmp_path / "train.csv", sentiment_rows(20))
    task = make_task(cfg_for("seq_classification", train))
    before = asdict(task.cfg)
    assert task.learnt_settings(task.read(train), list(range(20))) == {"labels": ["0", "1"]}
    assert asdict(task.cfg) == before and task.cfg.labels is None
    completed, _ = load_splits(task, 0)
    assert asdict(task.cfg) == before
    assert asdict(completed.cfg) == {**before, "labels": ["0", "1"]}
    assert completed.learnt_settings(completed.read(train), [0]) == {}  # a label set given is kept
    reg = make_task(cfg_for("regression", write_jsonl(tmp_path / "r.jsonl", regression_rows(8))))
    learnt = reg.learnt_settings(reg.read(tmp_path / "r.jsonl"), list(range(8)))
    assert sorted(learnt) == ["target_mean", "target_std"] and reg.cfg.target_mean is None


def test_the_orchestrator_asks_the_task_for_its_test_report(tmp_path):
    """Ad relevance scores its baselines on the test rows (a zero-shot one only given a
    starting encoder) and reads the order within each query of the model and of each, with
    paired differences; the other tasks report nothing more, and training/ names no task."""
    test = {"text": ["a b", "a", "c"], "pair": ["a b", "b", "d"], "target": [1.0, 0.0, 0.0]}
    test["group"] = ["q", "q", "q"]
    ad = make_task(task_cfg("ad_relevance"))
    model = torch.tensor([0.2, 0.1, 0.3])
    alone = ad.test_report(test, lambda: model, None)
    assert list(alone["baselines"]) == ["bm25"]
    assert list(alone["ranking"]) == ["fine-tuned", "bm25", "fine-tuned - bm25"]
    both = ad.test_report(test, lambda: model, lambda pairs: torch.tensor([0.9, 0.1, 0.5]))
    assert list(both["baselines"]) == ["bm25", "zero_shot"]
    assert both["baselines"]["zero_shot"]["test/auroc"] == 1.0
    assert both["ranking"]["zero_shot"]["mrr"]["mean"] == 1.0  # its relevant row first
    assert both["ranking"]["fine-tuned - zero_shot"]["mrr"]["mean"] == pytest.approx(-0.5)
    quiet = make_task(task_cfg("ad_relevance", baselines=False)).test_report(
        test, lambda: model, None
    )
    assert list(quiet) == ["ranking"] and list(quiet["ranking"]) == ["fine-tuned"]
    for k in ("seq_classification", "regression", "token_classification"):
        assert make_task(task_cfg(k)).test_report(test, None, None) == {}
    training = Path(bert_lightning.__file__).parent / "training"
    assert not [p for p in training.glob("*.py") if "ad_relevance" in p.read_text()]


@pytest.mark.parametrize("max_len", [8, 31, 32])
def test_pairs_encode_as_the_tokenizer_truncates_them_whole(tmp_path, max_len):
    """`encode_rows` cuts each text of a pair before encoding: the ids and types equal those
    of the whole pair truncated (longest first, an odd piece to the longer text), at every
    pair of lengths, words of several pieces, accents and punctuation included."""
    from bert_lightning.tasks.base import encode_rows, truncating

    tok = truncating(write_tokenizer(tmp_path / "tok.json"), max_len)
    words = ["great", "movie", "the", "bob", "aw", "ful", "zzzq", "Été", "naïve,", "!!"]
    rng = random.Random(max_len)
    rows = [
        tuple(" ".join(rng.choices(words, k=rng.randint(1, 40))) for _ in range(2))
        for _ in range(1500)
    ]
    ours, whole = encode_rows(tok, rows), tok.encode_batch(rows)
    assert [(e.ids, e.type_ids) for e in ours] == [(e.ids, e.type_ids) for e in whole]


def test_a_long_pair_costs_what_its_truncation_keeps(tmp_path):
    """Truncating a whole pair, `tokenizers` builds every combination of the two texts' cut
    pieces (4,823 overflowing encodings for two 1,000-word texts at 32): cut first, a pair
    holds a few, whatever the texts' lengths."""
    from bert_lightning.tasks.base import encode_rows, truncating

    tok = truncating(write_tokenizer(tmp_path / "tok.json"), 32)
    for words in (1_000, 20_000):
        (enc,) = encode_rows(tok, [("a " * words, "b " * words)])
        assert len(enc.ids) == 32 and len(enc.overflowing) <= 8
