"""Entity-level precision/recall/F1 for BIO tags (exact span and type), as conlleval counts;
Matthews correlation with the usual 0 for constant predictions; and torchmetrics' AUROC, F1,
Spearman and NDCG. A metric with no value on its rows (one class, one row, one target value,
nothing relevant) is NaN, said in one warning line: torchmetrics gives 0 there, a figure that
looks real (a run would keep the first checkpoint by it). And a split's loss (`SplitLoss`), the
same however its rows are batched."""

from __future__ import annotations

import torch
import torchmetrics
from torchmetrics import Metric
from torchmetrics.classification import BinaryAUROC, BinaryF1Score, MulticlassMatthewsCorrCoef
from torchmetrics.retrieval import RetrievalNormalizedDCG
from torchmetrics.utilities import dim_zero_cat

from bert_lightning.tasks.classification import bio_spans
from bert_lightning.tasks.undefined import (
    no_order,
    nothing_relevant,
    one_class,
    single_class,
    undefined,
)


class AUROC(BinaryAUROC):
    def compute(self) -> torch.Tensor:
        why = one_class(dim_zero_cat(self.target))
        return undefined("AUROC", why) if why else super().compute()


class F1(BinaryF1Score):
    """F1 of the positive class; 0/0 where no row is positive, true or predicted."""

    def compute(self) -> torch.Tensor:
        if int(self.tp + self.fp + self.fn) == 0:
            return undefined("F1", "with no positive row, true or predicted")
        return super().compute()


class SpearmanCorrCoef(torchmetrics.SpearmanCorrCoef):
    """Constant scores over targets with an order keep torchmetrics' 0 (`ranking.correlation`'s
    rule: a scorer that ranks nothing)."""

    def compute(self) -> torch.Tensor:
        why = no_order(dim_zero_cat(self.target))
        return undefined("Spearman", why) if why else super().compute()


class NDCG(RetrievalNormalizedDCG):
    """Queries with no relevant row are skipped; with none left there is no mean."""

    def compute(self) -> torch.Tensor:
        why = nothing_relevant(dim_zero_cat(self.target))
        return undefined("NDCG", why) if why else super().compute()


class SplitLoss(Metric):
    """A task's loss over every item of a split at once: `loss_of` (`Task.loss_of`) of what
    each batch gives of its items, rows or labelled tokens (`Task.loss_rows`), kept until
    `compute`. A mean of batch means would weigh a short batch, or one of few labelled tokens,
    like a full one, and a ranking or in-batch term would see only the rows one batch holds:
    the loss would change with `eval_batch_size`."""

    full_state_update = False

    def __init__(self, loss_of):
        super().__init__()
        self.loss_of = loss_of
        self.fields: list[str] = []  # what the items carry, known at the first batch

    def update(self, rows: dict[str, torch.Tensor]) -> None:
        for k, v in rows.items():
            if k not in self.fields:
                self.add_state(k, default=[], dist_reduce_fx="cat")
                self.fields.append(k)
            getattr(self, k).append(v.detach())

    def compute(self) -> torch.Tensor:
        return self.loss_of({k: dim_zero_cat(getattr(self, k)) for k in self.fields})


class EntityF1(Metric):
    """Counts over a whole evaluation set; `compute` gives precision, recall and F1 (`NAMES`):
    precision NaN with no entity predicted, recall with none to find, F1 with neither."""

    full_state_update = False
    NAMES = ("precision", "recall", "f1")

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
        tp, n_pred, n_gold = (float(v) for v in (self.tp, self.n_pred, self.n_gold))
        none = "with no entity predicted" if n_pred == 0 else None
        precision = undefined("entity precision", none) if none else torch.tensor(tp / n_pred)
        none = "with no entity in the gold tags" if n_gold == 0 else None
        recall = undefined("entity recall", none) if none else torch.tensor(tp / n_gold)
        if n_pred + n_gold == 0:
            f1 = undefined("entity F1", "with no entity, gold or predicted")
        else:
            f1 = torch.tensor(2 * tp / (n_pred + n_gold))  # the harmonic mean of the two
        return dict(zip(self.NAMES, (precision, recall, f1), strict=True))


class MatthewsCorrCoef(MulticlassMatthewsCorrCoef):
    """torchmetrics gives constant predictions (all acceptable) a small non-zero MCC; GLUE and
    scikit-learn give 0, the value the formula's limit and every published CoLA figure use.
    Rows of one true class have no MCC, whatever is predicted: NaN."""

    def compute(self) -> torch.Tensor:
        cm = self.confmat.double()  # (C, C) true x predicted
        s, c = cm.sum(), cm.trace()
        t, p = cm.sum(1), cm.sum(0)  # (C,), (C,)
        if why := single_class(t):
            return undefined("MCC", why)
        denom = ((s**2 - (p**2).sum()) * (s**2 - (t**2).sum())).sqrt()
        return ((c * s - (p * t).sum()) / denom if denom > 0 else torch.zeros(())).float()
