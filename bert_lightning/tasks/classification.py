"""Classification: a class per sentence (or pair), and BIO tags per word (CoNLL)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bert_lightning.data import tables as D
from bert_lightning.errors import UserError
from bert_lightning.model.heads import BertForTokenClassification
from bert_lightning.tasks.base import SentenceConfig, Task, TaskConfig, truncating
from bert_lightning.tasks.undefined import single_class


@dataclass
class SeqClassificationConfig(SentenceConfig):
    labels: list[str] | None


@dataclass
class TokenClassificationConfig(TaskConfig):
    labels: list[str] | None


class SeqClassification(Task):
    """Single sentences or pairs -> one of `labels` (learnt sorted from the train file if
    not given). Metrics: accuracy, F1 (of the second label for two classes, macro above),
    Matthews correlation."""

    config_class = SeqClassificationConfig
    problem_type = "single_label_classification"

    def learnt_settings(self, train, rows):
        """The label set of the whole train file: it names the classes (a class seen only in
        held-out rows is one the model is scored on, never a failed run); no statistic."""
        if self.cfg.labels:
            return {}
        col = self.cfg.label_column
        return {
            "labels": sorted(set(D.label_strings(train["raw"]["label_column"], train["path"], col)))
        }

    def with_labels(self, table):
        col = self.cfg.label_column
        table["label"] = D.label_values(
            table["raw"]["label_column"], self.cfg.labels, table["path"], col
        )
        return table

    @property
    def num_labels(self):
        return len(self.cfg.labels)

    def loss_rows(self, logits, batch, pairs=None):
        return {"logits": logits.float(), "label": batch["label"]}  # (B, L), (B,)

    def loss_of(self, rows):
        return F.cross_entropy(rows["logits"], rows["label"])

    def metrics(self):
        from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

        from bert_lightning.tasks.metrics import F1, MatthewsCorrCoef

        n = self.num_labels
        return nn.ModuleDict(
            {
                "acc": MulticlassAccuracy(n, average="micro"),
                "f1": F1() if n == 2 else MulticlassF1Score(n, average="macro"),
                "mcc": MatthewsCorrCoef(n),
            }
        )

    def monitor_undefined(self, table):
        if self.cfg.monitor != "mcc":
            return None
        return single_class(torch.bincount(torch.tensor(table["label"]), minlength=self.num_labels))

    def update(self, metrics, logits, batch):
        pred = logits.argmax(-1)  # (B,)
        for m in metrics.values():
            m.update(pred, batch["label"])

    def scores(self, logits):
        if self.num_labels != 2:
            raise UserError(f"a score needs a two-class model; this one has {self.num_labels}")
        return logits.float().softmax(-1)[:, 1]  # (B,) probability of the second label


class TokenClassification(Task):
    """CoNLL BIO files; each word's label sits on its first word piece (the others -100).
    Metric: entity-level precision/recall/F1 over words; a word cut off by truncation
    counts as predicted `O`."""

    config_class = TokenClassificationConfig
    head = BertForTokenClassification
    problem_type = "single_label_classification"

    def build_model(self, config) -> nn.Module:
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

    def learnt_settings(self, train, rows):
        if self.cfg.labels:
            return {}
        return {"labels": ["O", *sorted({t for s in train["tags"] for t in s} - {"O"})]}

    def with_labels(self, table):
        index = {l: i for i, l in enumerate(self.cfg.labels)}
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
        return len(self.cfg.labels)

    def loss_rows(self, logits, batch, pairs=None):
        """The labelled tokens (each word's first piece): the loss is their mean, over a split
        too, however many of them each batch holds."""
        labels = batch["token_labels"]  # (B, T), -100 unlabelled
        keep = labels != -100
        return {"logits": logits.float()[keep], "label": labels[keep]}  # (M, L), (M,)

    loss_of = SeqClassification.loss_of

    def metrics(self):
        from bert_lightning.tasks.metrics import EntityF1

        return nn.ModuleDict({"entity": EntityF1(self.cfg.labels)})

    @property
    def metric_names(self):
        from bert_lightning.tasks.metrics import EntityF1

        return list(EntityF1.NAMES)

    def monitor_undefined(self, table):
        """Recall and F1 have no value without a gold entity (precision: without a predicted one,
        which only the model decides)."""
        if self.cfg.monitor == "precision" or any(bio_spans(t) for t in table["tags"]):
            return None
        return "with no entity in the gold tags"

    def update(self, metrics, logits, batch):
        pred = logits.argmax(-1)  # (B, T)
        first = batch["first_piece"]  # (B, W)
        words = pred.gather(1, first.clamp(min=0))  # (B, W)
        labels = self.cfg.labels
        words = words.masked_fill(first < 0, labels.index("O") if "O" in labels else 0)
        metrics["entity"].update(words, batch["word_labels"])

    def compute(self, metrics):
        return {k: float(v) for k, v in metrics["entity"].compute().items()}


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
