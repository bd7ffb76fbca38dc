import csv
import sys
from collections import Counter
from pathlib import Path

import lightning as L
import pytest
import torch

from helpers import run_in_session, run_script, subprocess_env, tiny_overrides, write_corpus


class RecordExamples(L.Callback):
    """Writes the unmasked rows of every training batch this rank saw, and (rank 0) the
    training set, so the test can count who saw what."""

    def __init__(self, out_dir: str):
        self.out_dir, self.rows = Path(out_dir), []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        labels = batch["labels"]
        original = torch.where(labels != -100, labels, batch["input_ids"])  # (B, T)
        self.rows += [tuple(r) for r in original.tolist()]

    def on_train_epoch_end(self, trainer, pl_module):
        torch.save(self.rows, self.out_dir / f"seen_rank{trainer.global_rank}.pt")
        if trainer.global_rank == 0:
            rows = [tuple(r["input_ids"]) for r in trainer.datamodule.train_set]
            torch.save(rows, self.out_dir / "train_set.pt")


@pytest.mark.slow
def test_ddp_two_ranks_two_workers_see_each_example_once(tmp_path):
    """A real 2-process DDP run (gloo on the CPU, Lightning's subprocess launcher), 2 loader
    workers per rank, one epoch: every training example is seen by exactly one rank, once."""
    write_corpus(tmp_path / "corpus.jsonl", 20)
    overrides = tiny_overrides(
        tmp_path,
        "trainer=ddp_sim",
        "trainer.max_steps=-1",
        "trainer.max_epochs=1",
        "trainer.val_check_interval=null",
        "trainer.check_val_every_n_epoch=1",
        "data.num_workers=2",
        "validate_before_fit=false",
        f"hydra.run.dir={tmp_path}",
        "+callbacks.record._target_=test_ddp.RecordExamples",
        f"+callbacks.record.out_dir={tmp_path}",
    )
    run_script("train.py", overrides, tmp_path)
    train_set = Counter(torch.load(tmp_path / "train_set.pt", weights_only=True))
    ranks = [
        Counter(torch.load(tmp_path / f"seen_rank{r}.pt", weights_only=True)) for r in range(2)
    ]
    n = sum(train_set.values())
    assert sum(ranks[0].values()) == sum(ranks[1].values()) == n // 2  # equal shares
    seen = ranks[0] + ranks[1]
    assert not seen - train_set  # nothing seen that is not a training example, no duplicate
    assert sum((train_set - seen).values()) == n % 2  # the tail rule: n % ranks left out


class RecordGroups(L.Callback):
    """Writes the groups (queries) of every training batch this rank took, and (rank 0) the
    train split's groups, so the test can check that batches hold whole groups."""

    def __init__(self, out_dir: str):
        self.out_dir, self.batches = Path(out_dir), []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch["group"].tolist())

    def on_train_epoch_end(self, trainer, pl_module):
        torch.save(self.batches, self.out_dir / f"groups_rank{trainer.global_rank}.pt")
        if trainer.global_rank == 0:
            rows = trainer.datamodule.features["train"]
            torch.save([r["group"] for r in rows], self.out_dir / "train_groups.pt")


@pytest.mark.slow
def test_ddp_ranking_batches_hold_whole_groups_split_between_ranks(tmp_path):
    """The pairwise ranking loss under DDP (2 CPU processes): each rank takes every other batch
    of whole queries, as many as the other, and between them every query of the train split."""
    from finetune_fixtures import overrides, task_files, write_tokenizer

    extra = [*task_files(tmp_path, "ad_relevance"), "trainer=ddp_sim", "trainer.max_epochs=1"]
    extra += ["+callbacks.record._target_=test_ddp.RecordGroups", f"hydra.run.dir={tmp_path}"]
    extra += [f"+callbacks.record.out_dir={tmp_path}", "data.batch_size=4"]
    args = overrides(tmp_path, "ad_relevance", *extra)
    write_tokenizer(tmp_path / "tokenizer.json")
    run_script("finetune.py", args, tmp_path)
    train = Counter(torch.load(tmp_path / "train_groups.pt", weights_only=True))
    ranks = [torch.load(tmp_path / f"groups_rank{r}.pt", weights_only=True) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) > 1  # the ranks step together
    for batch in ranks[0] + ranks[1]:
        for g, n in Counter(batch).items():
            assert n == train[g]  # a query's rows all in one batch
    seen = {g for batches in ranks for batch in batches for g in batch}
    assert seen == set(train)


@pytest.mark.slow
def test_a_fine_tune_under_ddp_trains_its_epochs_validating_each(tmp_path):
    """`trainer=ddp_sim` says hardware only: fine-tuning keeps its schedule (its epochs, one
    validation each), not pretraining's steps and step-counted validation."""
    from finetune_fixtures import overrides, task_files, write_tokenizer

    write_tokenizer(tmp_path / "tokenizer.json")
    extra = [
        *task_files(tmp_path, "seq_classification"),
        "trainer=ddp_sim",
        f"hydra.run.dir={tmp_path}",
    ]
    run_script("finetune.py", overrides(tmp_path, "seq_classification", *extra), tmp_path)
    with open(tmp_path / "run" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["epoch"]) for r in rows if r.get("val/loss")] == [0, 1]  # trainer.max_epochs=2
    assert {float(r["epoch"]) for r in rows if r.get("train/loss")} == {0, 1}


@pytest.mark.slow
@pytest.mark.parametrize("start", ["console script", "python -m"])
def test_a_ddp_run_starts_through_the_console_script_and_the_package(tmp_path, start):
    """`bert-lightning pretrain` and `python -m bert_lightning pretrain` start their second
    rank too (Lightning re-runs what `__main__` ran): two ranks train the run's steps."""
    write_corpus(tmp_path / "corpus.jsonl")
    if start == "console script":
        cmd = [str(Path(sys.executable).parent / "bert-lightning")]
    else:
        cmd = [sys.executable, "-m", "bert_lightning"]
    args = tiny_overrides(tmp_path, "trainer=ddp_sim", "trainer.max_steps=2")
    cmd += ["pretrain", *args, f"hydra.run.dir={tmp_path}"]
    proc = run_in_session(cmd, subprocess_env(), 600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 2


@pytest.mark.slow
def test_a_budgeted_ddp_run_skips_and_ends_on_both_ranks_alike(tmp_path):
    """Two ranks, 8 s, a validation every 2 steps within a tenth: both take rank 0's skips and
    end (a rank that validated alone would hang the other), the last validation at the final
    step, the budget's line once."""
    write_corpus(tmp_path / "corpus.jsonl", 60)
    args = tiny_overrides(tmp_path, "trainer=ddp_sim", "trainer.max_steps=-1")
    args += ["trainer.max_time=00:00:00:08", "trainer.val_check_interval=2"]
    cmd = [sys.executable, str(Path(__file__).parents[1] / "train.py"), *args]
    proc = run_in_session([*cmd, f"hydra.run.dir={tmp_path}"], subprocess_env(), 600, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("the fit makes at most") == 1
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    with open(tmp_path / "metrics.csv") as f:
        validated = [int(r["step"]) for r in csv.DictReader(f) if r.get("val/loss")]
    state = last["callbacks"]["ValidationBudget"]
    assert validated[-1] == last["global_step"]
    assert validated[-2] < validated[-1]  # once at the final step
    assert state["spent"] <= 0.1 * 8 + state["cost"]  # the last may run past its estimate
