"""What every fine-tuning task shares: reading its files into tables, encoding rows,
building its head; and the train/validation/test tables of a run (`load_splits`). A task's
config (with the label set or target statistics learnt from the train file) is all that is
needed to rebuild it from a checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer
from torch import nn

from bert_lightning.data import tables as D
from bert_lightning.errors import UserError
from bert_lightning.model.heads import BertForSequenceClassification


def truncating(tok: Tokenizer, max_len: int) -> Tokenizer:
    tok = Tokenizer.from_str(tok.to_str())  # a copy: truncation is tokenizer state
    tok.enable_truncation(max_len)
    tok.no_padding()
    return tok


# keys every task's config has (conf/task/*.yaml); each kind adds its own in `keys`
COMMON_KEYS = ("kind", "train_file", "validation_file", "test_file", "split", "subsample")
COMMON_KEYS += ("monitor", "mode")
TABLE_KEYS = ("format", "encoding", "header", "names", "pooling", "label_column", "group_column")


class Task:
    """Sentence-level tasks read a table: `text_column` (+ `text_pair_column`), labels, groups.
    `keys`: every key its config may hold; `make_task` refuses others (a misspelt key would
    otherwise fall back to a default without a word)."""

    head = BertForSequenceClassification
    keys = (*COMMON_KEYS, *TABLE_KEYS, "text_column", "text_pair_column")
    grouped_batches = False  # True: each training batch holds whole groups (a ranking loss)

    def __init__(self, cfg: dict):
        self.cfg = dict(cfg)

    @property
    def text_columns(self) -> tuple[str, str | None]:
        return self.cfg["text_column"], self.cfg.get("text_pair_column")

    def read_rows(self, path):
        """A table file as this task reads it (format, encoding, header, column names)."""
        c = self.cfg
        return D.read_table(
            path, c.get("format"), c.get("encoding", "utf-8"), c.get("header", True), c.get("names")
        )

    def read(self, path) -> dict:
        c = self.cfg
        df = self.read_rows(path)
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
        raise UserError(f"a {self.cfg['kind']} model gives no score per row")

    def compute(self, metrics: nn.ModuleDict) -> dict[str, float]:
        return {k: float(m.compute()) for k, m in metrics.items()}


def load_splits(task: Task, seed: int) -> dict[str, dict]:
    """train/validation/test tables. A missing validation or test file is cut from the train
    file by `split` fractions, whole groups at a time; `subsample` then keeps exactly N rows of a
    part (whole groups but the last). The train file fixes the label set before any checking."""
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
