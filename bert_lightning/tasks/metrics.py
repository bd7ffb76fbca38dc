"""Entity-level precision/recall/F1 for BIO tags (exact span and type), as conlleval counts; and
Matthews correlation with the usual 0 for constant predictions."""

from __future__ import annotations

import torch
from torchmetrics import Metric
from torchmetrics.classification import MulticlassMatthewsCorrCoef


def bio_spans(tags: list[str]) -> set[tuple[int, int, str]]:
    """(start, end exclusive, type) of each entity. An `I-X` that does not continue an `X`
    entity starts one (conlleval's rule); `O` and anything else end the current one."""
    spans, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, t = tag.partition("-")
        if start is not None and not (prefix == "I" and t == kind):
            spans.add((start, i, kind))
            start = kind = None
        if prefix == "B" or (prefix == "I" and start is None):
            start, kind = i, t
    return spans


class EntityF1(Metric):
    """Counts over a whole evaluation set; `compute` gives precision, recall and F1."""

    full_state_update = False

    def __init__(self, labels: list[str]):
        super().__init__()
        self.labels = list(labels)
        for name in ("tp", "n_pred", "n_gold"):
            self.add_state(name, default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, pred: torch.Tensor, gold: torch.Tensor) -> None:
        """pred, gold: (B, W) label ids per word; gold -100 past the sentence's end."""
        for p_row, g_row in zip(pred.tolist(), gold.tolist(), strict=True):
            n = sum(1 for g in g_row if g != -100)
            p = bio_spans([self.labels[i] for i in p_row[:n]])
            g = bio_spans([self.labels[i] for i in g_row[:n]])
            self.tp += len(p & g)
            self.n_pred += len(p)
            self.n_gold += len(g)

    def compute(self) -> dict[str, torch.Tensor]:
        precision = self.tp / self.n_pred.clamp(min=1)
        recall = self.tp / self.n_gold.clamp(min=1)
        f1 = 2 * precision * recall / (precision + recall).clamp(min=1e-12)
        return {"precision": precision.float(), "recall": recall.float(), "f1": f1.float()}


class MatthewsCorrCoef(MulticlassMatthewsCorrCoef):
    """torchmetrics gives constant predictions (all acceptable) a small non-zero MCC; GLUE and
    scikit-learn give 0, the value the formula's limit and every published CoLA figure use."""

    def compute(self) -> torch.Tensor:
        cm = self.confmat.double()  # (C, C) true x predicted
        s, c = cm.sum(), cm.trace()
        t, p = cm.sum(1), cm.sum(0)  # (C,), (C,)
        denom = ((s**2 - (p**2).sum()) * (s**2 - (t**2).sum())).sqrt()
        return ((c * s - (p * t).sum()) / denom if denom > 0 else torch.zeros(())).float()
