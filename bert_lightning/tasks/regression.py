"""Regression: a real target per sentence (or pair)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bert_lightning.data import tables as D
from bert_lightning.errors import UserError
from bert_lightning.tasks.base import SentenceConfig, Task
from bert_lightning.tasks.undefined import no_order


@dataclass
class RegressionConfig(SentenceConfig):
    target_mean: float | None
    target_std: float | None

    def __post_init__(self):
        if self.target_std is not None and not 0 < self.target_std < math.inf:
            raise UserError(
                f"task.target_std={self.target_std}: expected a number above 0 (null: learnt "
                "from the rows trained on)"
            )


class Regression(Task):
    """A real target (e.g. a bid), learnt standardised by the train file's mean and std; MSE
    loss; metrics on the original scale."""

    config_class = RegressionConfig
    problem_type = "regression"

    def learnt_settings(self, train, rows):
        """The mean and std of the targets trained on (the whole file checked), each where the
        config leaves it null: a given one is kept, as the run records it."""
        c = self.cfg
        if c.target_mean is not None and c.target_std is not None:
            return {}
        values = D.float_values(train["raw"]["label_column"], train["path"], c.label_column)
        t = torch.tensor(values)[rows]  # (N,) the rows trained on
        std = float(t.std()) if len(t) > 1 else 1.0
        learnt = {"target_mean": float(t.mean()), "target_std": max(std, 1e-6)}
        return {k: v for k, v in learnt.items() if getattr(c, k) is None}

    def monitor_undefined(self, table):
        return (
            no_order(torch.tensor(table["target"]))
            if self.cfg.monitor in ("pearson", "spearman")
            else None
        )

    def with_labels(self, table):
        table["target"] = D.float_values(
            table["raw"]["label_column"], table["path"], self.cfg.label_column
        )
        return table

    def scores(self, logits):
        return logits.float()[:, 0] * self.cfg.target_std + self.cfg.target_mean  # (B,)

    def loss_rows(self, logits, batch, pairs=None):
        z = (batch["target"] - self.cfg.target_mean) / self.cfg.target_std  # (B,)
        return {"pred": logits.float()[:, 0], "z": z.float()}  # (B,), (B,)

    def loss_of(self, rows):
        return F.mse_loss(rows["pred"], rows["z"])

    def metrics(self):
        from torchmetrics import MeanAbsoluteError, MeanSquaredError, PearsonCorrCoef

        from bert_lightning.tasks.metrics import SpearmanCorrCoef

        return nn.ModuleDict(
            {
                "mse": MeanSquaredError(),
                "mae": MeanAbsoluteError(),
                "pearson": PearsonCorrCoef(),
                "spearman": SpearmanCorrCoef(),
            }
        )

    def update(self, metrics, logits, batch):
        pred = self.scores(logits)
        for m in metrics.values():
            m.update(pred, batch["target"].float())
