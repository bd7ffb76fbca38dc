"""A validation or test on two processes counts each row once: the same run at `optim.lr=0`
(the weights never move) on one process and under `trainer=ddp_sim` (2 CPU processes, gloo)
logs the same figures, on sets that do not split evenly, in batches that do not either (a rank
stepping one batch more than the other would desynchronise the collectives)."""

import csv
import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from finetune_fixtures import ad_rows, overrides, sentiment_rows, write_csv, write_tokenizer
from helpers import run_script, tiny_overrides, write_corpus

LR0 = "optim.lr=0"


def one_and_two_processes(script: str, args, root: Path) -> tuple[Path, Path]:
    """`script` run twice at once, in `root/one` on one process and in `root/two` on two
    (`args(folder, *extra)`: its command line there): the two folders."""
    folders = root / "one", root / "two"
    with ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(run_script, script, args(folder, *extra), folder)
            for folder, extra in zip(folders, ([], ["trainer=ddp_sim"]), strict=True)
        ]
        for run in runs:
            run.result()
    return folders


def eval_rows(folder: Path) -> list[dict[str, float]]:
    """The validation and test figures of metrics.csv, row by row, by key."""
    with open(folder / "metrics.csv") as f:
        rows = [
            {k: float(v) for k, v in r.items() if v and k.split("/")[0] in ("val", "test")}
            for r in csv.DictReader(f)
        ]
    return [r for r in rows if r]


def assert_same(one, two) -> None:
    """Equal within 1e-6; a perplexity within 1e-5 of itself: it is exp of a float32 sum of
    log-probabilities, cut into other batches on two processes, and in the hundreds."""
    assert one.keys() == two.keys()
    for k in one:
        rel = 1e-5 if k.endswith("ppl") else 0
        assert math.isclose(one[k], two[k], rel_tol=rel, abs_tol=1e-6), (k, one[k], two[k])


def assert_same_rows(one: Path, two: Path, keys: set[str]) -> None:
    """metrics.csv's validation and test figures, `keys` among them, the same in both."""
    rows = eval_rows(one)
    assert keys <= set().union(*rows)
    assert len(rows) == len(eval_rows(two))
    for r1, r2 in zip(rows, eval_rows(two), strict=True):
        assert_same(r1, r2)


def held_out(rows: list[dict], split: str) -> list[dict]:
    """`rows` of queries of their own (a query's rows belong to one split)."""
    return [r | {"query": f"{r['query']} {split}"} for r in rows]


# task: (train, validation and test rows, the run's settings, figures logged)
FINE_TUNING = {
    # 31 and 7 rows in batches of 3: the ranks hold 16 and 15 (6 batches each), 4 and 3 (2)
    "seq_classification": (
        (sentiment_rows(48), sentiment_rows(31, seed=1), sentiment_rows(7, seed=2)),
        ["data.eval_batch_size=3"],
        {"val/acc", "val/f1", "val/loss", "test/acc", "test/loss"},
    ),
    # queries of 3 rows, 33 and 9 in batches of 4: a query lies across the ranks' halves
    "ad_relevance": (
        (ad_rows(12), held_out(ad_rows(11), "dev"), held_out(ad_rows(3), "test")),
        ["data.eval_batch_size=4", "task.label_type=graded", "task.monitor=ndcg@10"],
        {"val/ndcg@10", "val/spearman", "val/loss", "test/ndcg@10", "test/loss"},
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", FINE_TUNING)
def test_fine_tuning_validates_and_tests_each_row_once_on_two_processes(tmp_path, task):
    tables, settings, keys = FINE_TUNING[task]
    tokenizer = write_tokenizer(tmp_path / "tokenizer.json").to_str()
    files = [
        f"task.{split}_file={write_csv(tmp_path / f'{split}.tsv', rows, sep=chr(9))}"
        for split, rows in zip(("train", "validation", "test"), tables, strict=True)
    ]

    def args(folder, *extra):
        folder.mkdir()
        (folder / "tokenizer.json").write_text(tokenizer)  # one for both runs
        base = overrides(folder, task, *files, *settings, *extra)
        return [*base, LR0, "trainer.max_epochs=1"]

    one, two = (f / "run" for f in one_and_two_processes("finetune.py", args, tmp_path))
    assert_same_rows(one, two, keys)
    results = [json.loads((run / "results.json").read_text()) for run in (one, two)]
    rows = {"train": len(tables[0]), "validation": len(tables[1]), "test": len(tables[2])}
    assert results[0]["rows"] == results[1]["rows"] == rows
    assert_same(results[0]["test"], results[1]["test"])
    assert_same(results[0]["best_val"], results[1]["best_val"])


@pytest.mark.slow
def test_pretraining_validates_each_example_once_on_two_processes(tmp_path):
    """17 validation examples in batches of 8: the ranks hold 8 and 9 (2 batches each)."""

    def args(folder, *extra):
        write_corpus(folder / "corpus.jsonl")
        base = tiny_overrides(folder, *extra, f"hydra.run.dir={folder}")
        return [*base, LR0, "data.max_eval_samples=17", "trainer.max_steps=2"]

    one, two = one_and_two_processes("train.py", args, tmp_path)
    assert_same_rows(one, two, {"val/loss", "val/mlm_acc", "val/ppl"})
