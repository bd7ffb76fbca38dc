"""Ad relevance: (query, ad) -> a score in [0, 1]; pointwise or pairwise (ranking) loss."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bert_lightning.data import tables as D
from bert_lightning.errors import UserError
from bert_lightning.model.heads import HEAD_POOLINGS, ZERO_SHOT_POOLING, BertBiEncoder
from bert_lightning.progress import Waiting
from bert_lightning.tasks.base import TableConfig, Task, ZeroShot, baselines_table
from bert_lightning.tasks.ranking import RELEVANT, ranking_report, ranking_table
from bert_lightning.tasks.undefined import no_order, nothing_relevant, one_class

LOSSES = ("pointwise", "pairwise", "listwise", "pointwise+pairwise", "pointwise+listwise")


@dataclass
class AdRelevanceConfig(TableConfig):
    """`pooling: null` is the architecture's own: the pooled [CLS] for the cross-encoder (as
    BERT; it exports to transformers), the mean for the bi-encoder (as sentence-transformers'
    models: it starts from the zero-shot ranking)."""

    pooling: Literal[HEAD_POOLINGS] | None
    query_column: str
    ad_column: str
    architecture: Literal["cross_encoder", "bi_encoder"]
    label_type: Literal["binary", "graded", "clicks"]
    grade_min: float
    grade_max: float
    graded_to: Literal["scale", "threshold"]
    threshold: float
    clicks_column: str
    impressions_column: str
    loss: Literal[LOSSES]
    pairwise_loss: Literal["logistic", "margin", "lambda"]
    pairwise_weight: float
    pairs: Literal["query", "batch"]
    margin: float
    contrastive_weight: float
    contrastive_scale: float
    contrastive_min: float
    baselines: bool

    def __post_init__(self):
        if self.pooling is None:
            self.pooling = ZERO_SHOT_POOLING if self.architecture == "bi_encoder" else "cls"
        if self.contrastive_weight and self.architecture != "bi_encoder":
            raise UserError(
                f"task.contrastive_weight={self.contrastive_weight} needs "
                "task.architecture=bi_encoder (a cross-encoder reads each query with its ad: "
                "no query to hold against the batch's other ads)"
            )


class AdRelevance(Task):
    """`[CLS] query [SEP] ad [SEP]` -> a relevance score in [0, 1] (sigmoid of one logit).

    Targets: `binary` 0/1; `graded` grades in [grade_min, grade_max], scaled to [0, 1]
    (`graded_to: scale`) or 1 at or above `threshold` (`graded_to: threshold`); `clicks`
    clicks / impressions. Loss: `pointwise` BCE on the score; `pairwise` within a query
    (`pairwise_loss`: `logistic` log(1 + e^-(s_i - s_j)), `margin` max(0, m - (s_i - s_j)), or
    `lambda`, the logistic term weighted by what swapping the pair changes NDCG, LambdaRank's
    weight) over pairs with target_i > target_j: of one query, or with `pairs: batch` of the
    whole batch, across queries too, a global order as Spearman reads it; `listwise`: softmax
    cross-entropy over each query's rows (`listwise_loss`); `pointwise+pairwise` or
    `pointwise+listwise`: BCE + the ranking term, which `pairwise_weight` multiplies. A
    bi-encoder adds `contrastive_weight` x an in-batch contrastive term (`in_batch_loss`) to
    any of them."""

    config_class = AdRelevanceConfig

    @property
    def label_keys(self):
        clicks = self.cfg.label_type == "clicks"
        return ("clicks_column", "impressions_column") if clicks else ("label_column",)

    @property
    def text_keys(self):
        return "query_column", "ad_column"

    @property
    def group_key(self):
        """By default one query's rows stay together."""
        return "group_column" if self.cfg.group_column else "query_column"

    def with_labels(self, table):
        c, path, raw = self.cfg, table["path"], table["raw"]
        kind = c.label_type
        if kind == "clicks":
            clicks = D.float_values(raw["clicks_column"], path, c.clicks_column)
            shown = D.float_values(raw["impressions_column"], path, c.impressions_column)
            for i, (k, n) in enumerate(zip(clicks, shown, strict=True)):
                if not 0 <= k <= n or n <= 0:
                    raise D.DataError(
                        f"{path}: row {i + 1}, columns {c.clicks_column!r}/"
                        f"{c.impressions_column!r}: need 0 <= clicks <= impressions, "
                        f"impressions > 0; got {k}/{n}"
                    )
            table["target"] = [k / n for k, n in zip(clicks, shown, strict=True)]
            return table
        values = D.float_values(raw["label_column"], path, c.label_column)
        lo, hi = (0.0, 1.0) if kind == "binary" else (c.grade_min, c.grade_max)
        for i, v in enumerate(values):
            if (kind == "binary" and v not in (0.0, 1.0)) or not lo <= v <= hi:
                expected = "0 or 1" if kind == "binary" else f"a grade in [{lo}, {hi}]"
                raise D.DataError(
                    f"{path}: row {i + 1}, column {c.label_column!r}: label {v} is not {expected}"
                )
        if kind == "graded" and c.graded_to == "threshold":
            values = [float(v >= c.threshold) for v in values]
        elif kind == "graded":
            values = [(v - lo) / (hi - lo) for v in values]
        table["target"] = values
        return table

    def build_model(self, config) -> nn.Module:
        """`architecture`: `cross_encoder` (query and ad read together, as BERT) or
        `bi_encoder` (apart, a cosine: starts from the zero-shot ranking)."""
        if self.cfg.architecture == "bi_encoder":
            return BertBiEncoder(config, self.cfg.pooling)
        return super().build_model(config)

    @classmethod
    def hf_head(cls, stored):
        architecture = stored.get("architecture", "cross_encoder")  # older: cross-encoders
        if architecture != "cross_encoder":
            raise UserError(f"task.architecture={architecture}: no transformers class")
        return super().hf_head(stored)

    def scores(self, logits):
        return torch.sigmoid(logits.float()[:, 0])  # (B,)

    @property
    def grouped_batches(self) -> bool:
        """Batches of whole queries: a ranking term needs a query's rows together."""
        return self.cfg.loss != "pointwise"

    def baseline_scores(self, test: dict, zero_shot: ZeroShot | None) -> dict[str, torch.Tensor]:
        """{baseline: (N,) scores of the test rows}: BM25 of each row's query against its ad
        (`bm25_scores`) and, given the starting encoder, its zero-shot cosine (`zero_shot`;
        random weights rank nothing); none with `baselines: false`."""
        if not self.cfg.baselines:
            return {}
        n = f"{len(test['text']):,} test rows"
        with Waiting(f"the BM25 baseline of {n}"):
            out = {"bm25": bm25_scores(test["text"], test["pair"])}
        if zero_shot is not None:
            with Waiting(f"the zero-shot baseline of {n} (its encoder's cosines)"):
                out["zero_shot"] = zero_shot(list(zip(test["text"], test["pair"], strict=True)))
        return out

    def test_report(self, test: dict, score, zero_shot: ZeroShot | None) -> dict:
        """`baselines`: each baseline's test metrics that need no threshold (`score_metrics`);
        `ranking`: the order within each query, the fine-tuned model's (`score()`) beside the
        baselines', with the paired difference to each (`ranking_report`)."""
        baselines = self.baseline_scores(test, zero_shot)
        with Waiting(f"the fine-tuned model's scores of {len(test['text']):,} test rows"):
            scores = {"fine-tuned": score(), **baselines}
        with Waiting(f"the ranking of {len(set(test['group'])):,} test queries, with intervals"):
            out = {"ranking": ranking_report(scores, test["target"], test["group"])}
        if baselines:
            out["baselines"] = {k: score_metrics(self, test, s) for k, s in baselines.items()}
        return out

    def with_soft_labels(self, train: dict, encoder: ZeroShot, weight: float) -> dict:
        """Each target becomes (1 - weight) x itself + weight x the encoder's score of the row,
        min-max scaled over the rows to [0, 1] (only its order is the encoder's to give)."""
        with Waiting(f"soft_labels.encoder's scores of {len(train['text']):,} train rows"):
            s = encoder(list(zip(train["text"], train["pair"], strict=True)))  # (N,)
        lo, hi = s.min(), s.max()
        scaled = ((s - lo) / (hi - lo) if hi > lo else torch.zeros_like(s)).tolist()
        mixed = [
            (1 - weight) * y + weight * z for y, z in zip(train["target"], scaled, strict=True)
        ]
        return train | {"target": mixed}

    def report_table(self, results: dict) -> str:
        tables = [baselines_table(results)] if "baselines" in results else []
        return "\n\n".join([*tables, ranking_table(results["ranking"])])

    @property
    def uses_pair_embeddings(self) -> bool:
        return bool(self.cfg.contrastive_weight)

    @property
    def groups_named(self):
        return super().groups_named or ("query", "queries")

    def loss_rows(self, logits, batch, pairs=None):
        rows = {"score": logits.float()[:, 0], "target": batch["target"].float()}  # (B,) each
        if "group" in batch:  # what a ranking or in-batch term reads
            rows["group"] = batch["group"]  # (B,)
        if self.cfg.contrastive_weight and pairs is not None:
            rows["u"], rows["v"] = pairs  # (B, H) each
        return rows

    def loss_of(self, rows):
        """BCE for each row's level, read by Spearman across queries; a pairwise or listwise
        term for the order within a query, read by NDCG (times `pairwise_weight`); with
        `contrastive_weight` and the pooled queries and ads (`u`, `v`, which an ONNX export
        does not give), the in-batch term. Of a whole split (validation, test), `pairs: batch`
        and the in-batch term read the split as one batch."""
        s, t, group = rows["score"], rows["target"], rows.get("group")  # (N,) each
        c = self.cfg
        total = F.binary_cross_entropy_with_logits(s, t) if "pointwise" in c.loss else 0.0
        if c.contrastive_weight and "u" in rows:
            contrast = in_batch_loss(
                rows["u"], rows["v"], t, group, c.contrastive_scale, c.contrastive_min
            )
            total = total + c.contrastive_weight * contrast
        if c.loss == "pointwise":
            return total
        group = group if c.pairs == "query" else torch.zeros_like(group)
        if "pairwise" in c.loss:
            ranking = pairwise_loss(s, t, group, c.pairwise_loss, c.margin)
        else:
            ranking = listwise_loss(s, t, group)
        return total + c.pairwise_weight * ranking

    @property
    def binary_targets(self) -> bool:
        c = self.cfg
        return c.label_type == "binary" or (c.label_type == "graded" and c.graded_to == "threshold")

    def metrics(self):
        """Threshold-free metrics always (NDCG@10; AUROC, relevant = target >= 0.5, for 0/1
        labels and grades; Spearman for graded or click targets); accuracy and F1 at a score
        of 0.5 only for 0/1 targets, where a score is a probability of relevance and 0.5
        means something. Click rates have no AUROC: a rate is not relevant or not, and at 0.5
        nearly every row would be one class."""
        from torchmetrics.classification import BinaryAccuracy

        from bert_lightning.tasks.metrics import AUROC, F1, NDCG, SpearmanCorrCoef

        c = self.cfg
        m = {} if c.label_type == "clicks" else {"auroc": AUROC()}
        if self.binary_targets:
            m |= {"acc": BinaryAccuracy(), "f1": F1()}
        if c.label_type != "binary":
            m["spearman"] = SpearmanCorrCoef()
        m["ndcg@10"] = NDCG(top_k=10, empty_target_action="skip")
        return nn.ModuleDict(m)

    @property
    def metrics_depend_on(self) -> str:
        return f"task.label_type={self.cfg.label_type}"

    def monitor_undefined(self, table: dict) -> str | None:
        t = torch.tensor(table["target"])  # (N,)
        why = {
            "auroc": lambda: one_class((t >= RELEVANT).long()),
            "spearman": lambda: no_order(t),
            "ndcg@10": lambda: nothing_relevant(t),
        }.get(self.cfg.monitor)
        return why() if why else None

    def update(self, metrics, logits, batch):
        self.update_scores(metrics, self.scores(logits), batch["target"], batch["group"])

    @staticmethod
    def update_scores(metrics, score, target, group):
        """score, target, group: (B,); also what a baseline's scores go through."""
        t = target.float()
        relevant = (t >= RELEVANT).long()  # (B,)
        for name, m in metrics.items():
            if name == "spearman":
                m.update(score.float(), t)
            elif name == "ndcg@10":
                m.update(score.float(), t, indexes=group)
            elif name == "auroc":
                m.update(score.float(), relevant)
            else:  # acc, f1: the score is a probability
                m.update(score, relevant)


PAIR_BLOCK = 1 << 22  # entries of a (rows, N) block of a term over pairs of rows


def blocks(n: int, device) -> tuple[torch.Tensor, ...]:
    """Row indices 0..n-1 in blocks of at most PAIR_BLOCK / n rows: a term over pairs of n
    rows (a whole split's, at validation) added up block by block holds (rows, n) tensors,
    never (n, n); a training batch is one block."""
    return torch.arange(n, device=device).split(max(1, PAIR_BLOCK // max(n, 1)))


def pairwise_loss(s, t, group, kind: str, margin: float) -> torch.Tensor:
    """Mean over the pairs (i, j) of one group with t_i > t_j (`lambda`: weighted by
    `lambda_weights`); 0 (in the graph) if none."""
    total, weight = s.sum() * 0.0, s.new_zeros(())
    for rows in blocks(len(s), s.device):
        pairs = (group[rows, None] == group[None, :]) & (t[rows, None] > t[None, :])  # (R, N)
        diff = (s[rows, None] - s[None, :])[pairs]  # (P,)
        term = F.relu(margin - diff) if kind == "margin" else F.softplus(-diff)  # (P,)
        w = (
            lambda_weights(s.detach(), t, group, rows)[pairs]
            if kind == "lambda"
            else torch.ones_like(diff)
        )  # (P,)
        total, weight = total + (w * term).sum(), weight + w.sum()
    return total / weight.clamp(min=1e-12)


def group_ranks(v, group) -> torch.Tensor:
    """(N,) 1-based place of each row in its group, by v descending, ties by row order."""
    order = torch.argsort(-v, stable=True)
    order = order[torch.argsort(group[order], stable=True)]  # by group, then v, then row
    g = group[order]  # (N,) sorted
    place = torch.arange(len(v), device=v.device) - torch.searchsorted(g, g)  # (N,) from 0
    return torch.empty_like(place).scatter_(0, order, place + 1)


def lambda_weights(s, t, group, rows=None) -> torch.Tensor:
    """(R, N) |change of the group's NDCG| when row i (of `rows`; None: all) and row j swap
    places in the order of `s` (linear gains t, ties broken by row order; 0 across groups):
    LambdaRank's pair weight, which puts the loss where the top of a query's list is."""
    rows = torch.arange(len(s), device=s.device) if rows is None else rows
    discount = 1.0 / torch.log2(1.0 + group_ranks(s, group))  # (N,)
    _, g = torch.unique(group, return_inverse=True)  # (N,) 0..G-1
    gains = t / torch.log2(1.0 + group_ranks(t, group))  # (N,)
    ideal = t.new_zeros(int(g.max()) + 1).index_add(0, g, gains)[g]  # (N,): its group's IDCG
    same = group[rows, None] == group[None, :]  # (R, N)
    swap = (t[rows, None] - t[None, :]).abs() * (discount[rows, None] - discount[None, :]).abs()
    return swap / ideal[rows, None].clamp(min=1e-12) * same


def in_batch_loss(u, v, t, group, scale: float, min_target: float) -> torch.Tensor:
    """sentence-transformers' MultipleNegativesRankingLoss for graded rows: each positive row i
    (target >= `min_target`) holds its query u_i against every ad v_j of the batch, softmax
    cross-entropy over `scale` x cos(u_i, v_j) with its own ad the answer. The other ads of its
    query at least as relevant as its own are left out (not negatives); less relevant ones and
    every other query's ads are. The mean over positive rows (0 with none); the order of the
    rows does not change it."""
    u, v = F.normalize(u.float(), dim=-1), F.normalize(v.float(), dim=-1)  # (N, H) each
    total, count = u.sum() * 0.0, 0
    for rows in blocks(len(t), t.device):
        rows = rows[t[rows] >= min_target]  # (P,) the block's positive rows
        sim = scale * u[rows] @ v.T  # (P, N)
        left_out = (group[rows, None] == group[None, :]) & (t[None, :] >= t[rows, None])
        left_out[torch.arange(len(rows), device=t.device), rows] = False  # (P, N): not its own
        logits = sim.masked_fill(left_out, float("-inf"))  # (P, N)
        total, count = total + F.cross_entropy(logits, rows, reduction="sum"), count + len(rows)
    return total / max(count, 1)


def listwise_loss(s, t, group) -> torch.Tensor:
    """Softmax cross-entropy over each group's rows, the targets normalised to a distribution
    (ListNet's top-one form, TF-Ranking's softmax loss): -sum_i p_i log softmax(s)_i, p_i =
    t_i / sum_j t_j, averaged over the groups with a target above 0; 0 (in the graph) if none."""
    _, g = torch.unique(group, return_inverse=True)  # (N,) 0..G-1
    G = int(g.max()) + 1
    top = s.new_full((G,), -torch.inf).scatter_reduce(0, g, s.detach(), "amax")  # (G,)
    lse = top + torch.log(s.new_zeros(G).index_add(0, g, torch.exp(s - top[g])))  # (G,)
    total = t.new_zeros(G).index_add(0, g, t)  # (G,): each group's target sum
    keep = total > 0  # (G,)
    p = t / total[g].clamp(min=1e-12)  # (N,)
    return -(p * (s - lse[g]))[keep[g]].sum() / keep.sum().clamp(min=1)


THRESHOLD_FREE = ("auroc", "spearman", "ndcg@10")  # what a baseline's score is read by


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_scores(queries: list[str], ads: list[str]) -> torch.Tensor:
    """(N,) BM25 of row i's query against row i's ad."""
    import bm25s  # and scipy with it: the test's baseline alone, not scoring's

    logging.getLogger("bm25s").setLevel(logging.WARNING)  # its DEBUG lines reached stdout
    docs = list(dict.fromkeys(ads))
    doc_id = {d: i for i, d in enumerate(docs)}
    bm25 = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    bm25.index([words(d) for d in docs], show_progress=False)
    vocab = bm25.vocab_dict
    rows_of: dict[str, list[int]] = {}
    for i, q in enumerate(queries):
        rows_of.setdefault(q, []).append(i)
    out = np.zeros(len(queries), dtype=np.float32)
    for q, rows in rows_of.items():
        known = [w for w in words(q) if w in vocab]  # a word no ad has scores 0
        if known:
            out[rows] = bm25.get_scores(known)[[doc_id[ads[i]] for i in rows]]
    return torch.from_numpy(out)


def score_metrics(task: AdRelevance, table: dict, score: torch.Tensor) -> dict[str, float]:
    """The task's threshold-free metrics of any per-row score (only its order matters): min-max
    scaled to [0, 1] first, where AUROC reads it as it is (no sigmoid, no saturation)."""
    lo, hi = score.min(), score.max()
    score = (score - lo) / (hi - lo) if hi > lo else torch.zeros_like(score)
    metrics = {k: m for k, m in task.metrics().items() if k in THRESHOLD_FREE}
    groups = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
    group = torch.tensor([groups[g] for g in table["group"]])
    task.update_scores(metrics, score, torch.tensor(table["target"]), group)
    return {f"test/{k}": v for k, v in task.compute(metrics).items()}
