"""Ad relevance: (query, ad) -> a score in [0, 1]; pointwise or pairwise (ranking) loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import SpearmanCorrCoef
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryF1Score,
)
from torchmetrics.retrieval import RetrievalNormalizedDCG

from bert_lightning.data import tables as D
from bert_lightning.errors import UserError
from bert_lightning.model.heads import BertBiEncoder
from bert_lightning.tasks.base import COMMON_KEYS, TABLE_KEYS, Task

LOSSES = ("pointwise", "pairwise", "pointwise+pairwise")


class AdRelevance(Task):
    """`[CLS] query [SEP] ad [SEP]` -> a relevance score in [0, 1] (sigmoid of one logit).

    Targets: `binary` 0/1; `graded` grades in [grade_min, grade_max], scaled to [0, 1]
    (`graded_to: scale`) or 1 at or above `threshold` (`graded_to: threshold`); `clicks`
    clicks / impressions. Loss: `pointwise` BCE on the score, `pairwise` within a query
    (`pairwise_loss: logistic` log(1 + e^-(s_i - s_j)) or `margin` max(0, m - (s_i - s_j))
    over pairs with target_i > target_j: of one query, or with `pairs: batch` of the whole batch,
    across queries too, a global order as Spearman reads it), or `pointwise+pairwise`:
    BCE + `pairwise_weight` x the pairwise term."""

    keys = (*COMMON_KEYS, *TABLE_KEYS, "query_column", "ad_column", "label_type", "grade_min")
    keys += ("grade_max", "graded_to", "threshold", "clicks_column", "impressions_column")
    keys += ("loss", "pairwise_loss", "pairwise_weight", "margin", "pairs", "architecture")
    keys += ("baselines",)

    def __init__(self, cfg: dict):
        super().__init__(cfg)  # the loss is checked once here, not at every step
        if self.cfg.get("loss", "pointwise") not in LOSSES:
            raise UserError(f"task.loss={self.cfg['loss']!r}; expected one of {LOSSES}")
        if self.cfg.get("pairs", "query") not in ("query", "batch"):
            raise UserError(f"task.pairs={self.cfg['pairs']!r}; expected query or batch")

    @property
    def label_keys(self):
        clicks = self.cfg["label_type"] == "clicks"
        return ("clicks_column", "impressions_column") if clicks else ("label_column",)

    @property
    def text_columns(self):
        return self.cfg["query_column"], self.cfg["ad_column"]

    def read(self, path):
        table = super().read(path)
        if not self.cfg.get("group_column"):  # rows of one query stay together
            table["group"] = list(table["text"])
        return table

    def prepare(self, table):
        c, path, raw = self.cfg, table["path"], table["raw"]
        kind = c["label_type"]
        if kind == "clicks":
            clicks = D.float_values(raw["clicks_column"], path, c["clicks_column"])
            shown = D.float_values(raw["impressions_column"], path, c["impressions_column"])
            for i, (k, n) in enumerate(zip(clicks, shown, strict=True)):
                if not 0 <= k <= n or n <= 0:
                    raise D.DataError(
                        f"{path}: row {i + 1}, columns {c['clicks_column']!r}/"
                        f"{c['impressions_column']!r}: need 0 <= clicks <= impressions, "
                        f"impressions > 0; got {k}/{n}"
                    )
            table["target"] = [k / n for k, n in zip(clicks, shown, strict=True)]
            return table
        values = D.float_values(raw["label_column"], path, c["label_column"])
        lo, hi = (0.0, 1.0) if kind == "binary" else (c["grade_min"], c["grade_max"])
        for i, v in enumerate(values):
            if (kind == "binary" and v not in (0.0, 1.0)) or not lo <= v <= hi:
                expected = "0 or 1" if kind == "binary" else f"a grade in [{lo}, {hi}]"
                raise D.DataError(
                    f"{path}: row {i + 1}, column {c['label_column']!r}: "
                    f"label {v} is not {expected}"
                )
        if kind == "graded" and c.get("graded_to", "scale") == "threshold":
            values = [float(v >= c["threshold"]) for v in values]
        elif kind == "graded":
            values = [(v - lo) / (hi - lo) for v in values]
        table["target"] = values
        return table

    def build_model(self, config) -> nn.Module:
        """`architecture`: `cross_encoder` (query and ad read together, as BERT) or
        `bi_encoder` (apart, a cosine: starts from the zero-shot ranking)."""
        arch = self.cfg.get("architecture", "cross_encoder")
        if arch == "bi_encoder":
            return BertBiEncoder(config, self.cfg.get("pooling", "mean"))
        if arch != "cross_encoder":
            raise ValueError(f"task.architecture={arch!r}; expected cross_encoder or bi_encoder")
        return super().build_model(config)

    def scores(self, logits):
        return torch.sigmoid(logits.float()[:, 0])  # (B,)

    @property
    def grouped_batches(self) -> bool:
        """Batches of whole queries: a pairwise term needs pairs of one query."""
        return "pairwise" in self.cfg.get("loss", "pointwise")

    def loss(self, logits, batch):
        """`pointwise`, `pairwise`, or `pointwise+pairwise`: BCE + `pairwise_weight` x the
        pairwise term (BCE for each row's level, read by Spearman across queries; pairs for the
        order within a query, read by NDCG)."""
        s, t = logits.float()[:, 0], batch["target"].float()  # (B,), (B,)
        kind = self.cfg.get("loss", "pointwise")
        total = F.binary_cross_entropy_with_logits(s, t) if "pointwise" in kind else 0.0
        if "pairwise" in kind:
            scope = self.cfg.get("pairs", "query")
            total = total + self.cfg.get("pairwise_weight", 1.0) * pairwise_loss(
                s,
                t,
                batch["group"] if scope == "query" else torch.zeros_like(batch["group"]),
                self.cfg.get("pairwise_loss", "logistic"),
                self.cfg.get("margin", 1.0),
            )
        return total

    @property
    def binary_targets(self) -> bool:
        c = self.cfg
        return c["label_type"] == "binary" or (
            c["label_type"] == "graded" and c.get("graded_to", "scale") == "threshold"
        )

    def metrics(self):
        """Threshold-free metrics always (AUROC with relevant = target >= 0.5, NDCG@10, and
        Spearman for graded or click targets); accuracy and F1 at a score of 0.5 only for 0/1
        targets, where a score is a probability of relevance and 0.5 means something."""
        m = {"auroc": BinaryAUROC()}
        if self.binary_targets:
            m |= {"acc": BinaryAccuracy(), "f1": BinaryF1Score()}
        if self.cfg["label_type"] != "binary":
            m["spearman"] = SpearmanCorrCoef()
        m["ndcg@10"] = RetrievalNormalizedDCG(top_k=10, empty_target_action="skip")
        return nn.ModuleDict(m)

    def update(self, metrics, logits, batch):
        self.update_scores(metrics, self.scores(logits), batch["target"], batch["group"])

    @staticmethod
    def update_scores(metrics, score, target, group):
        """score, target, group: (B,); also what a baseline's scores go through."""
        t = target.float()
        relevant = (t >= 0.5).long()  # (B,)
        for name, m in metrics.items():
            if name == "spearman":
                m.update(score.float(), t)
            elif name == "ndcg@10":
                m.update(score.float(), t, indexes=group)
            elif name == "auroc":
                m.update(score.float(), relevant)
            else:  # acc, f1: the score is a probability
                m.update(score, relevant)


def pairwise_loss(s, t, group, kind: str, margin: float) -> torch.Tensor:
    """Mean over the pairs (i, j) of one group with t_i > t_j; 0 (in the graph) if none."""
    pairs = (group[:, None] == group[None, :]) & (t[:, None] > t[None, :])  # (B, B)
    diff = (s[:, None] - s[None, :])[pairs]  # (P,)
    if diff.numel() == 0:
        return s.sum() * 0.0
    return F.softplus(-diff).mean() if kind == "logistic" else F.relu(margin - diff).mean()
