"""Ranking read within each query, as ads are served: per-query Spearman, Kendall tau-b,
NDCG@5, NDCG@10 and the reciprocal rank of the first relevant row, averaged over queries, each
with a 95% bootstrap interval over queries, and the paired difference of two scorers of the same
rows (a gain is real when its interval excludes 0, whatever queries happened to be drawn)."""

from __future__ import annotations

import math
import warnings

import numpy as np

# the correlations within a query are `query_*`: `spearman` (a task metric) is over all rows
PER_QUERY = ("query_spearman", "query_kendall", "ndcg@5", "ndcg@10", "mrr")
RESAMPLES = 1000  # bootstrap draws of the queries
LEVEL = 0.95
RELEVANT = 0.5  # a row is relevant at a target of at least this (as AUROC reads targets)


def dcg(score: np.ndarray, gain: np.ndarray, k: int) -> float:
    """DCG@k, linear gains, rows of equal score sharing their positions' discounts (the
    expected DCG over the orders of the tie, McSherry & Najork 2008): a constant scorer gets
    a random order's value, not the one its input order happens to give."""
    order = np.argsort(-score, kind="stable")
    s, g = score[order], gain[order]
    total, start = 0.0, 0
    while start < len(s) and start < k:
        end = start + int(np.sum(s[start:] == s[start]))  # the tie: positions [start, end)
        discounts = 1.0 / np.log2(np.arange(start, min(end, k)) + 2.0)
        total += g[start:end].sum() * discounts.sum() / (end - start)
        start = end
    return total


def ndcg(score: np.ndarray, gain: np.ndarray, k: int) -> float:
    """NaN where no row has a gain (nothing to find)."""
    best = np.sort(gain)[::-1]
    ideal = dcg(best, best, k)
    return dcg(score, gain, k) / ideal if ideal > 0 else math.nan


def reciprocal_rank(score: np.ndarray, relevant: np.ndarray) -> float:
    """1 / the rank of the first relevant row (NaN without one); in a tie of n rows holding r
    relevant ones, the expectation over the tie's orders: P(first relevant at the tie's j-th
    place) = C(n - j, r - 1) / C(n, r)."""
    if not relevant.any():
        return math.nan
    best = score[relevant].max()
    above = int(np.sum(score > best))
    tie = score == best
    n, r = int(tie.sum()), int((tie & relevant).sum())
    return sum(math.comb(n - j, r - 1) / math.comb(n, r) / (above + j) for j in range(1, n - r + 2))


def correlation(fn, score: np.ndarray, target: np.ndarray) -> float:
    """NaN where the query has fewer than two rows or one grade (no order to read); 0 for
    constant scores (a scorer that ranks nothing)."""
    if len(target) < 2 or np.all(target == target[0]):
        return math.nan
    if np.all(score == score[0]):
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(fn(score, target).statistic)


def query_values(score, target, group) -> dict[str, np.ndarray]:
    """{metric: (Q,)} each query's value (queries in order of first appearance; NaN where the
    metric is undefined for the query, which depends on its targets only, so two scorers of the
    same rows are defined on the same queries)."""
    from scipy import stats  # a second to import: the ranking report's alone, not scoring's

    score, target = np.asarray(score, dtype=np.float64), np.asarray(target, dtype=np.float64)
    rows: dict = {}
    for i, g in enumerate(group):
        rows.setdefault(g, []).append(i)
    out = {m: np.empty(len(rows)) for m in PER_QUERY}
    for q, idx in enumerate(rows.values()):
        s, t = score[idx], target[idx]
        out["query_spearman"][q] = correlation(stats.spearmanr, s, t)
        out["query_kendall"][q] = correlation(stats.kendalltau, s, t)  # tau-b: ties on either side
        out["ndcg@5"][q] = ndcg(s, t, 5)
        out["ndcg@10"][q] = ndcg(s, t, 10)
        out["mrr"][q] = reciprocal_rank(s, t >= RELEVANT)
    return out


def interval(values: np.ndarray, seed: int = 0) -> dict:
    """The mean over the queries where `values` is defined and its percentile bootstrap
    interval (`RESAMPLES` draws of as many queries, with replacement; fixed seed, so a rerun
    prints the same bounds)."""
    v = values[~np.isnan(values)]
    if len(v) == 0:
        return {"mean": None, "low": None, "high": None, "queries": 0}
    draws = v[np.random.default_rng(seed).integers(0, len(v), (RESAMPLES, len(v)))]  # (R, Q)
    low, high = np.quantile(draws.mean(1), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return {"mean": float(v.mean()), "low": float(low), "high": float(high), "queries": len(v)}


def ranking_report(scores: dict, target, group) -> dict:
    """`scores`: {scorer: (N,) scores of the same rows}, the first the one compared. For each
    scorer, each metric's mean and interval; for each other scorer, `"<first> - <other>"`: the
    mean and interval of the per-query difference (paired: the same queries in each draw)."""
    values = {who: query_values(s, target, group) for who, s in scores.items()}
    first, *others = values
    out = {who: {m: interval(v[m]) for m in PER_QUERY} for who, v in values.items()}
    for who in others:
        diff = {m: values[first][m] - values[who][m] for m in PER_QUERY}
        out[f"{first} - {who}"] = {m: interval(diff[m]) for m in PER_QUERY}
    return out


def ranking_table(report: dict) -> str:
    """A title, then one row per scorer and difference: each metric's `mean [low, high]`."""
    width = max(map(len, report)) + 2
    lines = [
        f"within each query: the mean over queries [{LEVEL:.0%} bootstrap interval]",
        " " * width + "".join(f"{m:>24}" for m in PER_QUERY),
    ]
    for who, metrics in report.items():
        sign = "+" if " - " in who else ""
        cells = [
            f"{c['mean']:{sign}.3f} [{c['low']:{sign}.3f}, {c['high']:{sign}.3f}]"
            if c["queries"]
            else "-"
            for c in metrics.values()
        ]
        lines.append(f"{who:<{width}}" + "".join(f"{c:>24}" for c in cells))
    return "\n".join(lines)
