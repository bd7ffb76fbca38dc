"""The tasks: how each reads its files, turns labels into targets, encodes rows, builds its head,
and computes its loss and metrics. A task's config (with the label set or target statistics
learnt from the train file) is all that is needed to rebuild it from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, PearsonCorrCoef, SpearmanCorrCoef
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryF1Score,
    MulticlassAccuracy,
    MulticlassF1Score,
)
from torchmetrics.retrieval import RetrievalNormalizedDCG

from bert_lightning.data import tables as D
from bert_lightning.fields import check_keys
from bert_lightning.model.heads import BertForSequenceClassification, BertForTokenClassification
from bert_lightning.tasks.metrics import EntityF1, MatthewsCorrCoef


def truncating(tok: Tokenizer, max_len: int) -> Tokenizer:
    tok = Tokenizer.from_str(tok.to_str())  # a copy: truncation is tokenizer state
    tok.enable_truncation(max_len)
    tok.no_padding()
    return tok


# keys every task's config has (conf/task/*.yaml); each kind adds its own in `keys`
_COMMON = ("kind", "train_file", "validation_file", "test_file", "split", "subsample")
_COMMON += ("monitor", "mode")
_TABLE = ("format", "encoding", "header", "names", "pooling", "label_column", "group_column")


class Task:
    """Sentence-level tasks read a table: `text_column` (+ `text_pair_column`), labels, groups.
    `keys`: every key its config may hold; `make_task` refuses others (a misspelt key would
    otherwise fall back to a default without a word)."""

    head = BertForSequenceClassification
    keys = (*_COMMON, *_TABLE, "text_column", "text_pair_column")

    def __init__(self, cfg: dict):
        self.cfg = dict(cfg)

    @property
    def text_columns(self) -> tuple[str, str | None]:
        return self.cfg["text_column"], self.cfg.get("text_pair_column")

    def read(self, path) -> dict:
        c = self.cfg
        df = D.read_table(
            path, c.get("format"), c.get("encoding", "utf-8"), c.get("header", True), c.get("names")
        )
        a, b = self.text_columns
        table = {"path": str(path), "text": D.text_values(D.column(df, a, path), path, a)}
        table["pair"] = D.text_values(D.column(df, b, path), path, b) if b else None
        g = c.get("group_column")
        table["group"] = [str(v) for v in D.column(df, g, path)] if g else list(range(len(df)))
        table["raw"] = {k: D.column(df, c[k], path) for k in self.label_keys}
        return table

    @property
    def label_keys(self) -> tuple[str, ...]:
        return ("label_column",)

    def fit(self, train: dict) -> None:
        """Learn what the train file fixes (label set, target scale) into the config."""

    def prepare(self, table: dict) -> dict:
        """Raw label cells -> `label` ids or `target` floats (errors name file, row, column)."""
        raise NotImplementedError

    def encode(self, table: dict, tok: Tokenizer, max_len: int) -> list[dict]:
        tok = truncating(tok, max_len)
        inputs = (
            table["text"]
            if table["pair"] is None
            else list(zip(table["text"], table["pair"], strict=True))
        )
        groups = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
        out = []
        for i, enc in enumerate(tok.encode_batch(inputs)):
            f = {
                "input_ids": enc.ids,
                "token_type_ids": enc.type_ids,
                "group": groups[table["group"][i]],
            }
            for key in ("label", "target"):
                if key in table:
                    f[key] = table[key][i]
            out.append(f)
        return out

    @property
    def num_labels(self) -> int:
        return 1

    def build_model(self, config) -> nn.Module:
        return self.head(config, self.num_labels, self.cfg.get("pooling", "cls"))

    def metrics(self) -> nn.ModuleDict:
        raise NotImplementedError

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """One number per row, for `bert-lightning score`."""
        raise ValueError(f"a {self.cfg['kind']} model gives no score per row")

    def compute(self, metrics: nn.ModuleDict) -> dict[str, float]:
        return {k: float(m.compute()) for k, m in metrics.items()}


class SeqClassification(Task):
    """Single sentences or pairs -> one of `labels` (learnt sorted from the train file if
    not given). Metrics: accuracy, F1 (of the second label for two classes, macro above),
    Matthews correlation."""

    keys = (*Task.keys, "labels")

    def fit(self, train):
        if not self.cfg.get("labels"):
            self.cfg["labels"] = sorted({str(v) for v in train["raw"]["label_column"]})

    def prepare(self, table):
        col = self.cfg["label_column"]
        table["label"] = D.label_values(
            table["raw"]["label_column"], self.cfg["labels"], table["path"], col
        )
        return table

    @property
    def num_labels(self):
        return len(self.cfg["labels"])

    def loss(self, logits, batch):
        return F.cross_entropy(logits.float(), batch["label"])

    def metrics(self):
        n = self.num_labels
        return nn.ModuleDict(
            {
                "acc": MulticlassAccuracy(n, average="micro"),
                "f1": BinaryF1Score() if n == 2 else MulticlassF1Score(n, average="macro"),
                "mcc": MatthewsCorrCoef(n),
            }
        )

    def update(self, metrics, logits, batch):
        pred = logits.argmax(-1)  # (B,)
        for m in metrics.values():
            m.update(pred, batch["label"])

    def scores(self, logits):
        if self.num_labels != 2:
            raise ValueError(f"a score needs a two-class model; this one has {self.num_labels}")
        return logits.float().softmax(-1)[:, 1]  # (B,) probability of the second label


class Regression(Task):
    """A real target (e.g. a bid), learnt standardised by the train file's mean and std; MSE
    loss; metrics on the original scale."""

    keys = (*Task.keys, "target_mean", "target_std")

    def fit(self, train):
        if self.cfg.get("target_mean") is None:
            col = self.cfg["label_column"]
            t = torch.tensor(D.float_values(train["raw"]["label_column"], train["path"], col))
            std = float(t.std()) if len(t) > 1 else 1.0
            self.cfg["target_mean"], self.cfg["target_std"] = float(t.mean()), max(std, 1e-6)

    def prepare(self, table):
        table["target"] = D.float_values(
            table["raw"]["label_column"], table["path"], self.cfg["label_column"]
        )
        return table

    def scores(self, logits):
        return logits.float()[:, 0] * self.cfg["target_std"] + self.cfg["target_mean"]  # (B,)

    def loss(self, logits, batch):
        z = (batch["target"] - self.cfg["target_mean"]) / self.cfg["target_std"]  # (B,)
        return F.mse_loss(logits.float()[:, 0], z)

    def metrics(self):
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


class AdRelevance(Task):
    """`[CLS] query [SEP] ad [SEP]` -> a relevance score in [0, 1] (sigmoid of one logit).

    Targets: `binary` 0/1; `graded` grades in [grade_min, grade_max], scaled to [0, 1]
    (`graded_to: scale`) or 1 at or above `threshold` (`graded_to: threshold`); `clicks`
    clicks / impressions. Loss: `pointwise` BCE on the score, or `pairwise` within a query
    (`pairwise_loss: logistic` log(1 + e^-(s_i - s_j)) or `margin` max(0, m - (s_i - s_j))
    over pairs with target_i > target_j)."""

    keys = (*_COMMON, *_TABLE, "query_column", "ad_column", "label_type", "grade_min")
    keys += ("grade_max", "graded_to", "threshold", "clicks_column", "impressions_column")
    keys += ("loss", "pairwise_loss", "margin")

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

    def scores(self, logits):
        return torch.sigmoid(logits.float()[:, 0])  # (B,)

    def loss(self, logits, batch):
        s, t = logits.float()[:, 0], batch["target"].float()  # (B,), (B,)
        if self.cfg.get("loss", "pointwise") == "pointwise":
            return F.binary_cross_entropy_with_logits(s, t)
        return pairwise_loss(
            s,
            t,
            batch["group"],
            self.cfg.get("pairwise_loss", "logistic"),
            self.cfg.get("margin", 1.0),
        )

    def metrics(self):
        m = {"auroc": BinaryAUROC(), "acc": BinaryAccuracy(), "f1": BinaryF1Score()}
        if self.cfg["label_type"] != "binary":
            m["spearman"] = SpearmanCorrCoef()
        m["ndcg@10"] = RetrievalNormalizedDCG(top_k=10, empty_target_action="skip")
        return nn.ModuleDict(m)

    def update(self, metrics, logits, batch):
        score, t = self.scores(logits), batch["target"].float()  # (B,), (B,)
        relevant = (t >= 0.5).long()  # (B,)
        for name, m in metrics.items():
            if name == "spearman":
                m.update(score, t)
            elif name == "ndcg@10":
                m.update(score, t, indexes=batch["group"])
            else:
                m.update(score, relevant)


def pairwise_loss(s, t, group, kind: str, margin: float) -> torch.Tensor:
    """Mean over the pairs (i, j) of one group with t_i > t_j; 0 (in the graph) if none."""
    pairs = (group[:, None] == group[None, :]) & (t[:, None] > t[None, :])  # (B, B)
    diff = (s[:, None] - s[None, :])[pairs]  # (P,)
    if diff.numel() == 0:
        return s.sum() * 0.0
    return F.softplus(-diff).mean() if kind == "logistic" else F.relu(margin - diff).mean()


class TokenClassification(Task):
    """CoNLL BIO files; each word's label sits on its first word piece (the others -100).
    Metric: entity-level precision/recall/F1 over words; a word cut off by truncation
    counts as predicted `O`."""

    head = BertForTokenClassification
    keys = (*_COMMON, "labels", "pooling")

    def build_model(self, config) -> nn.Module:
        if self.cfg.get("pooling", "cls") != "cls":
            raise ValueError("task.pooling: a token classifier reads every token; no pooling")
        return self.head(config, self.num_labels)

    def read(self, path):
        words, tags, lines = D.read_conll(path)
        return {
            "path": str(path),
            "words": words,
            "tags": tags,
            "lines": lines,
            "group": list(range(len(words))),
        }

    def fit(self, train):
        if not self.cfg.get("labels"):
            seen = {t for s in train["tags"] for t in s} - {"O"}
            self.cfg["labels"] = ["O", *sorted(seen)]

    def prepare(self, table):
        index = {l: i for i, l in enumerate(self.cfg["labels"])}
        table["label"] = []
        for tags, lines in zip(table["tags"], table["lines"], strict=True):
            for tag, n in zip(tags, lines, strict=True):
                if tag not in index:
                    raise D.DataError(
                        f"{table['path']}: line {n}, column 'tag': label {tag!r} "
                        f"is not in the label set {list(index)}"
                    )
            table["label"].append([index[t] for t in tags])
        return table

    def encode(self, table, tok, max_len):
        tok = truncating(tok, max_len)
        out = []
        for enc, labels in zip(
            tok.encode_batch(table["words"], is_pretokenized=True), table["label"], strict=True
        ):
            first = [-1] * len(labels)
            token_labels = [-100] * len(enc.ids)
            for pos, w in enumerate(enc.word_ids):
                if w is not None and first[w] == -1:
                    first[w] = pos
                    token_labels[pos] = labels[w]
            out.append(
                {
                    "input_ids": enc.ids,
                    "token_type_ids": enc.type_ids,
                    "token_labels": token_labels,
                    "word_labels": labels,
                    "first_piece": first,
                }
            )
        return out

    @property
    def num_labels(self):
        return len(self.cfg["labels"])

    def loss(self, logits, batch):
        return F.cross_entropy(
            logits.float().flatten(0, 1), batch["token_labels"].flatten(), ignore_index=-100
        )

    def metrics(self):
        return nn.ModuleDict({"entity": EntityF1(self.cfg["labels"])})

    def update(self, metrics, logits, batch):
        pred = logits.argmax(-1)  # (B, T)
        first = batch["first_piece"]  # (B, W)
        words = pred.gather(1, first.clamp(min=0))  # (B, W)
        words = words.masked_fill(
            first < 0, self.cfg["labels"].index("O") if "O" in self.cfg["labels"] else 0
        )
        metrics["entity"].update(words, batch["word_labels"])

    def compute(self, metrics):
        return {k: float(v) for k, v in metrics["entity"].compute().items()}


TASKS = {
    "seq_classification": SeqClassification,
    "regression": Regression,
    "ad_relevance": AdRelevance,
    "token_classification": TokenClassification,
}


def make_task(cfg: dict) -> Task:
    if cfg.get("kind") not in TASKS:
        raise ValueError(f"task.kind={cfg.get('kind')!r}; expected one of {sorted(TASKS)}")
    cls = TASKS[cfg["kind"]]
    check_keys(cfg, cls.keys, f"task (kind={cfg['kind']})")
    return cls(cfg)


def load_splits(task: Task, seed: int) -> dict[str, dict]:
    """train/validation/test tables. A missing validation or test file is cut from the train
    file by `split` fractions, whole groups at a time; `subsample` then keeps about N rows
    (whole groups) of a part. The train file fixes the label set before any checking."""
    c = task.cfg
    train = task.read(c["train_file"])
    task.fit(train)
    tables = {"train": task.prepare(train)}
    missing = {k: float(c["split"][k]) for k in ("validation", "test") if not c.get(f"{k}_file")}
    if missing:
        parts = D.grouped_split(train["group"], missing, seed)
        tables = {k: subset(train, idx) for k, idx in parts.items()}
    for k in ("validation", "test"):
        if c.get(f"{k}_file"):
            tables[k] = task.prepare(task.read(c[f"{k}_file"]))
    for k, n in (c.get("subsample") or {}).items():
        if n is not None:
            tables[k] = subset(tables[k], D.grouped_subsample(tables[k]["group"], int(n), seed))
    for k, t in tables.items():
        if not t["group"]:
            raise D.DataError(f"{Path(c['train_file'])}: the {k} part is empty; adjust task.split")
    return tables


def subset(table: dict, idx: list[int]) -> dict:
    out = {}
    for k, v in table.items():
        if isinstance(v, list):
            out[k] = [v[i] for i in idx]
        elif isinstance(v, dict):
            out[k] = subset(v, idx)
        else:
            out[k] = v
    return out
