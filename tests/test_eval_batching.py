"""Every loss a run or `evaluate` reports is the loss of the
whole split, whatever `eval_batch_size` cuts it into (a mean of batch means weighs a short batch,
or one of few labelled tokens, like a full one; a ranking term sees only the pairs a batch holds);
and no group (query) of a validation or test file is also in the train file."""

import math
from dataclasses import asdict
from functools import partial

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from bert_lightning.data.tables import collate
from bert_lightning.errors import UserError
from bert_lightning.inference import Finetuned, table_metrics
from bert_lightning.tasks import ad_relevance
from bert_lightning.tasks.ad_relevance import in_batch_loss, pairwise_loss
from bert_lightning.tasks.datamodule import TaskDataModule
from bert_lightning.tasks.kinds import load_splits, make_task
from bert_lightning.training.finetune_module import FinetuneModule
from finetune_fixtures import (
    ad_rows,
    cfg_for,
    regression_rows,
    sentiment_rows,
    tiny_config,
    write_conll,
    write_csv,
    write_jsonl,
    write_tokenizer,
)

CASES = {
    "token_classification": {},
    "seq_classification": {},
    "regression": {},
    "pointwise+pairwise": {"loss": "pointwise+pairwise", "pairwise_weight": 3.0},
    "listwise": {"loss": "listwise"},
    "lambda, pairs=batch": {"loss": "pairwise", "pairwise_loss": "lambda", "pairs": "batch"},
    "contrastive": {"architecture": "bi_encoder", "contrastive_weight": 2.0},
}


def validation_split(tmp_path, case):
    """The task and its validation table: a file of its own for CoNLL and ad relevance (the
    latter's queries interleaved, so that no batch size follows them), cut from the train file
    for the others."""
    if case == "token_classification":
        train, dev = write_conll(tmp_path / "train.conll"), write_conll(tmp_path / "dev.conll", 5)
        cfg = cfg_for(case, train, validation_file=str(dev))
    elif case == "seq_classification":
        cfg = cfg_for(case, write_csv(tmp_path / "train.csv", sentiment_rows(100)))
    elif case == "regression":
        cfg = cfg_for(case, write_jsonl(tmp_path / "train.jsonl", regression_rows(100)))
    else:
        rows = ad_rows(16)
        train = write_csv(tmp_path / "ads.csv", rows[:36])
        dev = write_csv(tmp_path / "dev.csv", sorted(rows[36:], key=lambda r: r["label"]))
        cfg = cfg_for("ad_relevance", train, validation_file=str(dev), label_type="graded",
                      monitor="spearman", **CASES[case])  # fmt: skip
    task, tables = load_splits(make_task(cfg), 0)
    return task, tables["validation"]


def alone(rows, pad_id):
    """Each row as a batch of its own (no padding): the model's inputs."""
    keys = ("input_ids", "token_type_ids", "attention_mask")
    return [[collate([r], pad_id)[k] for k in keys] for r in rows]


def by_hand(case, task, logits, rows):
    """The loss of the whole split from each row's own logits, written out; None where the
    definition is the loss of all the rows as one batch (`Task.loss` of them)."""
    if case == "token_classification":  # the mean over every labelled token of the split
        labels = [torch.tensor(r["token_labels"]) for r in rows]
        total = sum(
            float(F.cross_entropy(x, y, reduction="sum", ignore_index=-100))
            for x, y in zip(logits, labels, strict=True)
        )
        return total / sum(int((y != -100).sum()) for y in labels)
    if case == "seq_classification":
        labels = [torch.tensor(r["label"]) for r in rows]
        losses = [float(F.cross_entropy(x, y)) for x, y in zip(logits, labels, strict=True)]
        return sum(losses) / len(rows)
    if case == "regression":
        c = task.cfg
        z = [(r["target"] - c.target_mean) / c.target_std for r in rows]
        return sum((float(x[0]) - y) ** 2 for x, y in zip(logits, z, strict=True)) / len(rows)
    if case == "pointwise+pairwise":  # BCE over rows + 3 x the mean over pairs of one query
        s = [float(x[0]) for x in logits]
        t, g = [r["target"] for r in rows], [r["group"] for r in rows]
        p = [1 / (1 + math.exp(-x)) for x in s]
        bce = -sum(y * math.log(q) + (1 - y) * math.log(1 - q) for q, y in zip(p, t, strict=True))
        pairs = [
            math.log1p(math.exp(-(s[i] - s[j])))
            for i in range(len(s))
            for j in range(len(s))
            if g[i] == g[j] and t[i] > t[j]
        ]
        return bce / len(s) + 3.0 * sum(pairs) / len(pairs)
    return None


@pytest.mark.parametrize("case", list(CASES))
def test_the_validation_loss_is_the_same_however_rows_are_batched(tmp_path, case):
    """One fixed model's validation loss, rows fed one at a time, three at a time and all at
    once, by a run's validation (Lightning) and by `evaluate` (`table_metrics`): the same
    number, the whole split's loss as its definition gives it."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    task, table = validation_split(tmp_path, case)
    torch.manual_seed(0)
    config = asdict(tiny_config(tok.get_vocab_size()))
    module = FinetuneModule(config, task, {}, False, tok.to_str(), 32)
    model = module.model.eval()
    rows = task.encode(table, tok, 32)
    assert len(rows) >= 8
    ft = Finetuned(model, task, tok.to_str(), 32)
    quiet = {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, **quiet)
    got = {}
    for size in (1, 3, len(rows)):
        got[f"evaluate, batches of {size}"] = table_metrics(ft, table, size)["loss"]
        data = TaskDataModule(
            task=task, tables={"validation": table}, tokenizer=tok, batch_size=8,
            eval_batch_size=size, max_seq_length=32, seed=0,
        )  # fmt: skip
        validated = trainer.validate(module, data, verbose=False)[0]
        got[f"validation, batches of {size}"] = validated["val/loss"]
    inputs = alone(rows, tok.token_to_id("[PAD]"))
    with torch.no_grad():
        logits = [model(*x)[0] for x in inputs]
        want = by_hand(case, task, logits, rows)
        if want is None:
            pairs = None
            if task.uses_pair_embeddings:  # the pooled queries and ads, each row alone
                u, v = zip(*(model.pair_embeddings(*x) for x in inputs), strict=True)
                pairs = (torch.cat(u), torch.cat(v))
            want = float(task.loss(torch.stack(logits), collate(rows, 0), pairs))
    assert got == pytest.approx(dict.fromkeys(got, want), abs=1e-5)


def test_pair_terms_add_up_block_by_block(monkeypatch):
    """A split's pair terms are summed in blocks of rows (never an (N, N) tensor): blocks of one
    row give what one block gives."""
    g = torch.Generator().manual_seed(0)
    n = 40
    s, t = torch.randn(n, generator=g), torch.randint(0, 3, (n,), generator=g) / 2
    group = torch.arange(n) % 7
    u, v = torch.randn(n, 8, generator=g), torch.randn(n, 8, generator=g)
    kinds = ("logistic", "margin", "lambda")
    terms = {k: partial(pairwise_loss, s, t, group, k, 1.0) for k in kinds}
    terms["in_batch"] = partial(in_batch_loss, u, v, t, group, 5.0, 0.5)
    whole = {k: float(f()) for k, f in terms.items()}
    monkeypatch.setattr(ad_relevance, "PAIR_BLOCK", n)
    assert len(ad_relevance.blocks(n, "cpu")) == n
    assert {k: float(f()) for k, f in terms.items()} == pytest.approx(whole, rel=1e-6)


# ---------------------------------------------------------------- groups across files


def test_a_query_of_the_validation_or_test_file_also_in_the_train_file_is_refused(tmp_path):
    """As a split of one file keeps a query on one side, so do files given apart: a query
    written in another case or spacing is the same query. One file may be both the validation
    and the test file (a dev set of its own)."""
    rows = ad_rows(8)
    train = write_csv(tmp_path / "ads.csv", rows[:18])
    dev = write_csv(tmp_path / "dev.csv", rows[18:])
    test_rows = [r | {"query": r["query"].upper().replace(" ", "  ")} for r in rows[15:]]
    test = write_csv(tmp_path / "test.csv", test_rows)
    files = {"validation_file": str(dev), "test_file": str(test)}
    task = make_task(
        cfg_for("ad_relevance", train, label_type="graded", monitor="spearman", **files)
    )
    with pytest.raises(UserError) as e:
        load_splits(task, 0)
    assert str(e.value) == (
        f"{test}: 1 of its 3 queries are also in {train} (e.g. 'show 5'); a query's rows "
        "belong on one side of a split: remove them from one of the files"
    )
    write_csv(test, rows[18:])
    load_splits(task, 0)


def test_a_group_of_the_validation_file_also_in_the_train_file_is_refused(tmp_path):
    """`task.group_column` names the groups of any table task; without one, rows are their own
    groups and nothing is compared."""
    rows = [r | {"doc": f"d{i // 4}"} for i, r in enumerate(sentiment_rows(40))]
    train = write_csv(tmp_path / "train.csv", rows[:32])
    dev = write_csv(tmp_path / "dev.csv", rows[28:])
    task = make_task(cfg_for("seq_classification", train, validation_file=str(dev),
                             group_column="doc"))  # fmt: skip
    with pytest.raises(UserError) as e:
        load_splits(task, 0)
    assert str(e.value) == (
        f"{dev}: 1 of its 3 groups (task.group_column=doc) are also in {train} (e.g. 'd7'); "
        "a group's rows belong on one side of a split: remove them from one of the files"
    )
    load_splits(make_task(cfg_for("seq_classification", train, validation_file=str(dev))), 0)
