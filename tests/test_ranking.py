"""Per-query ranking metrics and their bootstrap intervals (tasks/ranking.py), against hand
computations, scipy and torchmetrics."""

import math

import numpy as np
import pytest
import torch
from torchmetrics.retrieval import RetrievalMRR, RetrievalNormalizedDCG

from bert_lightning.tasks.ranking import (
    PER_QUERY,
    interval,
    ndcg,
    query_values,
    ranking_report,
    ranking_table,
    reciprocal_rank,
)

D2, D3 = 1.0, 1 / math.log2(3)  # the discounts of positions 1 and 2


def test_ndcg_of_a_tie_is_the_mean_over_its_orders():
    """Scores (1, 1, 0), gains (1, 0, 0): the relevant row is first or second, each half the
    time; at k=1 it is seen half the time."""
    s, g = np.array([1.0, 1.0, 0.0]), np.array([1.0, 0.0, 0.0])
    assert ndcg(s, g, 10) == pytest.approx((D2 + D3) / 2)
    assert ndcg(s, g, 1) == pytest.approx(0.5)
    assert ndcg(np.array([0.0, 1.0, 0.5]), np.array([0.5, 1.0, 0.0]), 10) == pytest.approx(
        (1.0 * D2 + 0.0 * D3 + 0.5 / 2.0) / (1.0 * D2 + 0.5 * D3)
    )
    assert math.isnan(ndcg(s, np.zeros(3), 10))  # nothing to find


def test_reciprocal_rank_of_a_tie_is_its_expectation():
    """Three tied rows above a fourth: one relevant among them is at 1, 2 or 3 alike; two
    relevant ones put the first at 1 unless the other row comes first (1 in 3)."""
    s = np.array([0.5, 0.5, 0.5, 0.1])
    assert reciprocal_rank(s, np.array([1, 0, 0, 0], bool)) == pytest.approx(
        (1 + 1 / 2 + 1 / 3) / 3
    )
    assert reciprocal_rank(s, np.array([1, 1, 0, 0], bool)) == pytest.approx(2 / 3 + 1 / 3 / 2)
    assert reciprocal_rank(s, np.array([0, 0, 0, 1], bool)) == pytest.approx(1 / 4)
    assert math.isnan(reciprocal_rank(s, np.zeros(4, bool)))


def test_queries_of_one_row_or_one_grade_have_no_correlation():
    score = [0.9, 0.2, 0.4, 0.3, 0.5, 0.1, 0.8]
    target = [1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 1.0]
    group = ["a", "b", "b", "b", "c", "c", "d"]  # a, d: one row; c: one grade
    v = query_values(score, target, group)
    for m in ("query_spearman", "query_kendall"):
        assert math.isnan(v[m][0]) and math.isnan(v[m][2]) and math.isnan(v[m][3])
    assert v["query_spearman"][1] == pytest.approx(1.0)  # b: 0.4 > 0.3 > 0.2 as 1 > 0.5 > 0
    assert v["query_kendall"][1] == pytest.approx(1.0)
    assert v["ndcg@10"][0] == 1.0 and v["mrr"][0] == 1.0  # one relevant row, first
    assert v["ndcg@10"][2] == 1.0 and v["mrr"][2] == 1.0  # c: all at 0.5, any order is ideal
    assert math.isnan(query_values([0.3], [0.0], ["x"])["mrr"][0])  # nothing relevant


def test_correlations_are_scipys_with_ties_and_zero_for_constant_scores():
    from scipy import stats

    s, t = [0.1, 0.4, 0.4, 0.9, 0.2], [0.0, 0.5, 1.0, 1.0, 0.0]
    v = query_values(s, t, ["q"] * 5)
    assert v["query_spearman"][0] == pytest.approx(stats.spearmanr(s, t).statistic)
    assert v["query_kendall"][0] == pytest.approx(stats.kendalltau(s, t).statistic)  # tau-b
    flat = query_values([0.3] * 5, t, ["q"] * 5)
    assert flat["query_spearman"][0] == 0.0 and flat["query_kendall"][0] == 0.0


def test_without_ties_ndcg_and_mrr_are_torchmetrics():
    g = torch.Generator().manual_seed(0)
    score = torch.rand(60, generator=g)
    target = torch.randint(0, 3, (60,), generator=g).float() / 2
    group = torch.arange(60) // 6
    v = query_values(score.numpy(), target.numpy(), group.tolist())
    for k in (5, 10):
        theirs = RetrievalNormalizedDCG(top_k=k, empty_target_action="skip")
        theirs.update(score, target, indexes=group)
        assert np.nanmean(v[f"ndcg@{k}"]) == pytest.approx(float(theirs.compute()), abs=1e-6)
    mrr = RetrievalMRR(empty_target_action="skip")
    mrr.update(score, target >= 0.5, indexes=group)
    assert np.nanmean(v["mrr"]) == pytest.approx(float(mrr.compute()), abs=1e-6)


def test_the_interval_is_over_defined_queries_and_holds_the_mean():
    values = np.array([0.2, np.nan, 0.4, 0.6, 0.8, 1.0])
    got = interval(values)
    assert got["queries"] == 5 and got["mean"] == pytest.approx(0.6)
    assert 0.2 < got["low"] < 0.6 < got["high"] < 1.0
    assert got == interval(values)  # a fixed seed: a rerun prints the same bounds
    same = interval(np.full(4, 0.3))
    assert same["low"] == same["high"] == pytest.approx(0.3)
    assert interval(np.array([np.nan]))["mean"] is None


def test_a_gain_on_every_query_has_an_interval_above_zero_and_noise_does_not():
    rng = np.random.default_rng(1)
    group = np.repeat(np.arange(40), 5)
    target = rng.integers(0, 3, 200) / 2
    perfect, noise = target + rng.random(200) * 0.1, rng.random(200)
    report = ranking_report({"model": perfect, "random": noise}, target, group)
    assert set(report) == {"model", "random", "model - random"}
    gain = report["model - random"]["ndcg@10"]
    assert gain["low"] > 0 and report["model"]["ndcg@10"]["mean"] == pytest.approx(1.0)
    paired = report["model - random"]["query_spearman"]
    assert paired["mean"] == pytest.approx(
        report["model"]["query_spearman"]["mean"] - report["random"]["query_spearman"]["mean"]
    )
    other = ranking_report({"a": noise, "b": rng.random(200)}, target, group)["a - b"]
    assert other["ndcg@10"]["low"] < 0 < other["ndcg@10"]["high"]
    table = ranking_table(report).splitlines()
    assert [line.split()[0] for line in table[2:]] == ["model", "random", "model"]
    assert table[1].split() == list(PER_QUERY)
