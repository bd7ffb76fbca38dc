"""Why a metric has no value on a split's rows (one class, one row, one target value, nothing
relevant), and the NaN it is then, said in one warning line: torchmetrics gives 0 there, a
figure that looks real. Apart from `metrics.py` so that what checks a split before a run (and
scoring, serving) imports no torchmetrics."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def undefined(name: str, why: str) -> torch.Tensor:
    """NaN, with the one line that says why."""
    log.warning("%s is undefined %s: NaN", name, why)
    return torch.tensor(float("nan"))


def one_class(target: torch.Tensor) -> str | None:
    """Why AUROC-like metrics have no value on these 0/1 targets (N,), or None."""
    pos = int(target.sum())
    if 0 < pos < len(target):
        return None
    return f"on rows of one class ({pos} relevant, {len(target) - pos} not)"


def single_class(counts: torch.Tensor) -> str | None:
    """Why MCC has no value on rows of these counts per true class (C,), or None."""
    return (
        None if int((counts > 0).sum()) >= 2 else f"on rows of one class ({int(counts.sum())} rows)"
    )


def nothing_relevant(target: torch.Tensor) -> str | None:
    """Why NDCG has no value on these gains (N,), or None."""
    return None if bool((target > 0).any()) else "with no relevant row in any query"


def no_order(target: torch.Tensor) -> str | None:
    """Why a correlation has no value on these targets (N,) (no order to read), or None."""
    if len(target) < 2:
        return f"on {len(target)} row(s)"
    return "on targets of one value" if bool((target == target[0]).all()) else None
