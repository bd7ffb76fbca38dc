"""What every fine-tuning task shares: its config (a dataclass per kind, read from
`conf/task/<kind>.yaml`, where each key has its one default), reading its files into tables,
encoding rows, building its head; and the train/validation/test tables of a run
(`load_splits`). A task's config (with the label set or target statistics learnt from the train
file) is all that is needed to rebuild it from a checkpoint."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch
from tokenizers import Encoding, Tokenizer
from torch import nn

from bert_lightning.data import tables as D
from bert_lightning.errors import UserError
from bert_lightning.model.heads import HEAD_POOLINGS, BertForSequenceClassification
from bert_lightning.shipped import group_defaults

if TYPE_CHECKING:  # torchmetrics, imported where a metric is made: scoring and serving make none
    from bert_lightning.tasks.metrics import SplitLoss

log = logging.getLogger(__name__)

# a baseline's scorer: the starting encoder's cosine of each (text, pair) row, (N,)
ZeroShot = Callable[[list[tuple[str, str]]], torch.Tensor]
LOWER_IS_BETTER = ("loss", "mse", "mae", "ppl")  # and every `*_loss`; other metrics: higher


def monitor_mode(metric: str) -> str:
    """The checkpoint and early-stopping mode that keeps the best by `metric` (a task's metric,
    or a logged key such as pretraining's `val/ppl`)."""
    name = metric.rpartition("/")[2]
    return "min" if name in LOWER_IS_BETTER or name.endswith("_loss") else "max"


def truncating(tok: Tokenizer, max_len: int) -> Tokenizer:
    tok = Tokenizer.from_str(tok.to_str())  # a copy: truncation is tokenizer state
    tok.enable_truncation(max_len)
    tok.no_padding()
    return tok


def encode_rows(tok: Tokenizer, rows: list) -> list[Encoding]:
    """`tok.encode_batch(rows)` of a `truncating` tokenizer, for texts or (text, pair) rows. A
    pair's texts are first cut after a word past its `max_length`-th piece, the longer one kept
    the longer: its truncation (longest first; an odd piece to the longer) keeps the pieces it
    kept of the whole texts, without the overflow `tokenizers` builds of every combination of
    the two texts' cut pieces, quadratic in their lengths (two 10,000-character texts of
    one-character pieces: 2.45 GB and 18 s)."""
    if not rows or isinstance(rows[0], str):
        return tok.encode_batch(rows)
    n = tok.truncation["max_length"]
    whole = Tokenizer.from_str(tok.to_str())  # one text at a time: linear in its length
    whole.no_truncation()
    texts = [t for pair in rows for t in pair]
    encs = whole.encode_batch(texts, add_special_tokens=False)
    cut = []
    for a, b, ea, eb in zip(texts[::2], texts[1::2], encs[::2], encs[1::2], strict=True):
        if len(ea.ids) > len(eb.ids):
            b, nb = cut_after(b, eb, n)
            a, _ = cut_after(a, ea, max(n, nb))
        else:
            a, na = cut_after(a, ea, n)
            b, _ = cut_after(b, eb, max(n, na - 1))
        cut.append((a, b))
    return tok.encode_batch(cut)


def cut_after(text: str, enc: Encoding, k: int) -> tuple[str, int]:
    """`text` up to the end of the word that holds piece `k` (0-based), whose pieces are then
    the first ones of `enc`, and how many it has: at least k + 1, or all the text's."""
    if len(enc.ids) <= k:
        return text, len(enc.ids)
    words = enc.word_ids  # a new list at each read
    last = k
    while last + 1 < len(words) and words[last + 1] == words[k]:  # a word's pieces: in a row
        last += 1
    return text[: enc.offsets[last][1]], last + 1


@dataclass
class TaskConfig:
    """The keys every kind has. No field has a default: the YAML gives each key its one, and a
    checkpoint stores them all (`asdict`), what the train file fixed included."""

    kind: str
    train_file: str
    validation_file: str | None
    test_file: str | None
    split: dict[str, float]
    subsample: dict[str, int | None]
    monitor: str
    mode: Literal["min", "max"]


@dataclass
class TableConfig(TaskConfig):
    """A task that reads a table (CSV, TSV, JSONL, Parquet) and pools each row's sequence."""

    format: str | None
    encoding: str
    header: bool
    names: list[str] | None
    pooling: Literal[HEAD_POOLINGS]
    label_column: str
    group_column: str | None


@dataclass
class SentenceConfig(TableConfig):
    text_column: str
    text_pair_column: str | None


class Task:
    """Sentence-level tasks read a table: `text_column` (+ `text_pair_column`), labels, groups.
    `config_class`: the dataclass of its config (`make_task` reads a config dict into it, so a
    misspelt key or a bad value is an error before any file is read)."""

    config_class: type[TaskConfig] = SentenceConfig
    head = BertForSequenceClassification
    problem_type: str | None = None  # what transformers' config.json calls its loss
    grouped_batches = False  # True: each training batch holds whole groups (a ranking loss)

    def __init__(self, cfg: TaskConfig):
        self.cfg = cfg

    def test_report(self, test: dict, score: Callable[[], torch.Tensor], zero_shot) -> dict:
        """What `results.json` holds beside `test`, read on the test table (`test`): {} for a
        task with nothing more. `score()`: the fine-tuned model's (N,) scores of its rows;
        `zero_shot`: the starting encoder's cosine of each pair's two texts (`ZeroShot`), None
        from random weights."""
        return {}

    def with_soft_labels(self, train: dict, encoder: ZeroShot, weight: float) -> dict:
        """The train table with an encoder's scores of its rows mixed into its targets
        (`soft_labels.encoder`; `encoder`: its zero-shot cosine of (text, pair) rows); a task
        without (query, ad) targets has none to mix them into."""
        raise UserError(
            f"soft_labels.encoder: a {self.cfg.kind} task has no (query, ad) targets to mix an "
            "encoder's scores into (task=ad_relevance has)"
        )

    def report_table(self, results: dict) -> str:
        """`test_report`'s part of `results`, as the end of a run prints it."""
        return ""

    @property
    def text_keys(self) -> tuple[str, str]:
        """The config keys naming the text columns (the second's value None: single texts)."""
        return "text_column", "text_pair_column"

    @property
    def text_columns(self) -> tuple[str, str | None]:
        return tuple(getattr(self.cfg, k) for k in self.text_keys)

    def read_rows(self, path):
        """A table file as this task reads it (format, encoding, header, column names)."""
        c = self.cfg
        return D.read_table(path, c.format, c.encoding, c.header, c.names)

    def read(self, path) -> dict:
        c = self.cfg
        df = self.read_rows(path)
        values = lambda key: D.column(df, getattr(c, key), path, key)
        (ka, kb), (a, b) = self.text_keys, self.text_columns
        table = {"path": str(path), "text": D.text_values(values(ka), path, a)}
        table["pair"] = D.text_values(values(kb), path, b) if b else None
        g = self.group_key
        table["group"] = D.group_keys(values(g)) if g else list(range(len(df)))
        table["raw"] = {k: values(k) for k in self.label_keys}
        return table

    @property
    def label_keys(self) -> tuple[str, ...]:
        return ("label_column",)

    @property
    def group_key(self) -> str | None:
        """The config key naming the column whose rows stay on one side of a split; None: each
        row alone."""
        return "group_column" if self.cfg.group_column else None

    @property
    def groups_named(self) -> tuple[str, str] | None:
        """What a group is called in messages, (one, many); None where each row is its own."""
        g = getattr(self.cfg, "group_column", None)
        return ("group", f"groups (task.group_column={g})") if g else None

    def learnt_settings(self, train: dict, rows: list[int]) -> dict:
        """What the train file fixes that the config leaves open (label set, target scale), as
        the config keys to set; {} when the config gives them. `train`: the file's table,
        checked whole (its errors name the file's rows); `rows`: the indices of those trained
        on, all but the validation and test rows `split` cuts from it, which nothing fitted
        sees."""
        return {}

    def with_labels(self, table: dict) -> dict:
        """Raw label cells -> `label` ids or `target` floats (errors name file, row, column)."""
        raise NotImplementedError

    def encode(self, table: dict, tok: Tokenizer, max_len: int) -> list[dict]:
        tok = truncating(tok, max_len)
        groups = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
        out = []
        for i, enc in enumerate(encode_rows(tok, inputs(table))):
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

    @property
    def uses_pair_embeddings(self) -> bool:
        """The loss also reads the pooled queries and ads (`loss(logits, batch, (u, v))`)."""
        return False

    def loss_rows(self, logits, batch: dict, pairs=None) -> dict[str, torch.Tensor]:
        """What the loss reads of each item of `batch` (a row, or a labelled token), one per
        item along the first dim: a split's loss is `loss_of` all its items at once
        (`SplitLoss`), however they were batched. `pairs`: the pooled (queries, ads), where
        `uses_pair_embeddings`."""
        raise NotImplementedError

    def loss_of(self, rows: dict[str, torch.Tensor]) -> torch.Tensor:
        """The loss of the items `rows` holds (`loss_rows`, of one batch or of a whole split)."""
        raise NotImplementedError

    def loss(self, logits, batch: dict, pairs=None) -> torch.Tensor:
        """The loss of one batch."""
        return self.loss_of(self.loss_rows(logits, batch, pairs))

    def loss_metric(self) -> SplitLoss:
        """What a split's loss is added up in, batch by batch."""
        from bert_lightning.tasks.metrics import SplitLoss

        return SplitLoss(self.loss_of)

    def logits_and_rows(self, model, batch: dict) -> tuple[torch.Tensor, dict]:
        """`model`'s logits on `batch` and what the task's loss reads of them (`loss_rows`), as
        training computes them: with the pooled queries and ads where the loss reads them (a
        bi-encoder's in-batch term; an ONNX export, which gives logits only, goes without)."""
        inputs = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        if not (self.uses_pair_embeddings and hasattr(model, "pair_embeddings")):
            logits = model(*inputs)
            return logits, self.loss_rows(logits, batch)
        pairs = model.pair_embeddings(*inputs)  # (B, H) each
        logits = model.score(*pairs)  # (B, 1)
        return logits, self.loss_rows(logits, batch, pairs)

    def build_model(self, config) -> nn.Module:
        return self.head(config, self.num_labels, self.cfg.pooling)

    @classmethod
    def hf_head(cls, stored: dict) -> tuple[str, str | None]:
        """transformers' class of this head (ours bear its name) and its `problem_type`, from
        the task config a checkpoint stores (or the part of it that names pooling and
        architecture); refused where no class computes what this head does."""
        pooling = stored.get("pooling", "cls")  # older checkpoints: the pooled [CLS]
        if pooling != "cls":
            raise UserError(
                f"task.pooling={pooling}: transformers' BertForSequenceClassification reads "
                "the pooled [CLS]; a classifier over another pooling has no equivalent there"
            )
        return cls.head.__name__, cls.problem_type

    def metrics(self) -> nn.ModuleDict:
        raise NotImplementedError

    @property
    def metric_names(self) -> list[str]:
        """What `compute` reports (and validation logs as `val/<name>`)."""
        return list(self.metrics())

    @property
    def metrics_depend_on(self) -> str | None:
        """The config key that decides which metrics the task has, for an error to name."""
        return None

    def monitor_undefined(self, table: dict) -> str | None:
        """Why `task.monitor` has no value on the rows of `table` whatever the model predicts
        (one class, one target value), as the metric's warning says it; None when it has."""
        return None

    def check_monitor(self, validation: dict, where) -> None:
        """`task.monitor` must be a metric the task reports (or the loss), `task.mode` its
        direction, and it must have a value on the validation rows (`where`: their file): a
        NaN at every validation, or a mode against the metric, would keep the first or the
        worst checkpoint and stop the run early, with nothing said."""
        m, names = self.cfg.monitor, [*self.metric_names, "loss"]
        if m not in names:
            by = f" ({self.metrics_depend_on})" if self.metrics_depend_on else ""
            raise UserError(
                f"task.monitor={m!r}: not a metric of this task{by}; expected one of {names}"
            )
        if self.cfg.mode != (mode := monitor_mode(m)):
            better = "lower" if mode == "min" else "higher"
            raise UserError(
                f"task.mode={self.cfg.mode} contradicts task.monitor={m} ({better} is better): "
                f"give task.mode={mode}"
            )
        if why := self.monitor_undefined(validation):
            raise D.DataError(f"{where}: the validation part: task.monitor={m} is undefined {why}")

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """One number per row, for `bert-lightning score`."""
        raise UserError(f"a {self.cfg.kind} model gives no score per row")

    def compute(self, metrics: nn.ModuleDict) -> dict[str, float]:
        return {k: float(m.compute()) for k, m in metrics.items()}


def inputs(table: dict) -> list:
    """What the tokenizer reads of each row: its text, or its (text, pair)."""
    texts, pairs = table["text"], table["pair"]
    return texts if pairs is None else list(zip(texts, pairs, strict=True))


def load_splits(task: Task, seed: int) -> tuple[Task, dict[str, dict]]:
    """The task completed by its train file and the train/validation/test tables. A missing
    validation or test file is cut from the train file by `split` fractions, whole groups at a
    time; what `task.learnt_settings` learns (label set, target scale) completes the config,
    from the rows trained on, before any checking; `subsample` then keeps exactly N rows of a
    part (whole groups but the last). The monitor is checked against the validation rows."""
    files = {k: getattr(task.cfg, f"{k}_file") for k in ("validation", "test")}
    shipped = group_defaults("task", "_files")["split"]
    if cut := [k for k, f in files.items() if f and float(task.cfg.split[k]) != shipped[k]]:
        raise UserError(
            " ".join(f"task.split.{k}={task.cfg.split[k]}" for k in cut)
            + f": {' and '.join(f'task.{k}_file' for k in cut)} given, task.train_file is not "
            "cut for them (the fractions are of a missing file's rows); leave them out"
        )
    train = task.read(task.cfg.train_file)
    missing = {k: float(task.cfg.split[k]) for k, f in files.items() if not f}
    parts = D.grouped_split(train["group"], missing, seed) if missing else None
    trained_on = parts["train"] if parts else list(range(len(train["group"])))
    task = type(task)(replace(task.cfg, **task.learnt_settings(train, trained_on)))
    c = task.cfg
    train = task.with_labels(train)
    tables = {k: subset(train, idx) for k, idx in parts.items()} if parts else {"train": train}
    for k, f in files.items():
        if f:
            tables[k] = task.with_labels(task.read(f))
            check_apart(task, tables[k], train)
    for k, n in c.subsample.items():
        if n is not None:
            if type(n) is not int or n < 1:
                raise UserError(f"task.subsample.{k}={n!r}; expected a row count >= 1, or null")
            tables[k] = subset(tables[k], D.grouped_subsample(tables[k]["group"], n, seed))
    for k, t in tables.items():
        if not t["group"]:
            raise D.DataError(f"{Path(c.train_file)}: the {k} part is empty; adjust task.split")
    warn_of_copies(tables)
    task.check_monitor(tables["validation"], Path(files["validation"] or c.train_file))
    return task, tables


def check_apart(task: Task, table: dict, train: dict) -> None:
    """No group (query) of a validation or test file given apart is in the train file, as
    read (`group_keys`: as an uncased tokenizer reads it): its rows would be scored on what
    was trained on, as a split of one file never does."""
    if task.groups_named is None:
        return
    one, many = task.groups_named
    groups, trained = list(dict.fromkeys(table["group"])), set(train["group"])
    shared = [g for g in groups if g in trained]
    if shared:
        raise D.DataError(
            f"{table['path']}: {len(shared)} of its {len(groups)} {many} are also in "
            f"{train['path']} (e.g. {shared[0]!r}); a {one}'s rows belong on one side of a "
            "split: remove them from one of the files"
        )


def warn_of_copies(tables: dict[str, dict]) -> None:
    """One warning when validation or test rows have the exact text (and pair) of a training
    row: their scores read rows trained on. Never refused: published sets have such copies
    (1% of SST-2's validation rows)."""
    trained = set(row_texts(tables["train"]))
    counts, example = [], None
    for k in ("validation", "test"):
        texts = row_texts(tables[k])
        copies = [t for t in texts if t in trained]
        counts.append(f"{k} {len(copies)} of {len(texts)} rows")
        if copies and example is None:
            example = copies[0]
    if example is not None:
        log.warning(
            "%s have the text of a training row, e.g. %r: their scores read rows trained on",
            ", ".join(counts),
            example,
        )


def row_texts(table: dict) -> list:
    """What the model reads of each row: its text, (text, pair), or its words joined."""
    return [" ".join(w) for w in table["words"]] if "words" in table else inputs(table)


def train_texts(table: dict) -> list[str]:
    """A table's texts, what a WordPiece tokenizer trained for a run reads."""
    if "words" in table:
        return [" ".join(w) for w in table["words"]]
    return table["text"] + (table["pair"] or [])


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


def baselines_table(results: dict) -> str:
    """The fine-tuned model's test metrics beside its baselines', those they all have."""
    rows = {"fine-tuned": results["test"], **results["baselines"]}
    names = [k for k in results["test"] if all(k in m for m in results["baselines"].values())]
    lines = [
        f"{'test (' + str(results['rows']['test']) + ' rows)':<22}"
        + "".join(f"{n[5:]:>10}" for n in names)
    ]
    for who, m in rows.items():
        lines.append(f"{who:<22}" + "".join(f"{m.get(n, float('nan')):>10.4f}" for n in names))
    return "\n".join(lines)
