"""No wait is silent. Off a terminal a step a user waits on (testing the best
checkpoint, the baselines, `evaluate`'s task metrics, each alpha of `interpolate`, a cell of
`downstream`) says what it waits on when it starts, and then a line on stderr whenever no
progress line came for `progress.SECONDS` (here made short, a step made slow)."""

import logging
import re
import time

import pytest

from bert_lightning import progress
from bert_lightning.cli import main
from bert_lightning.commands import interpolate
from bert_lightning.config import compose
from bert_lightning.errors import UserError
from bert_lightning.experiments import downstream
from bert_lightning.tasks import ad_relevance
from bert_lightning.training.finetune import finetune
from finetune_fixtures import (
    overrides,
    tiny_budget,
    write_dataset,
    write_hf_folder,
    write_our_ckpt,
    write_tokenizer,
)

BEAT = 0.05  # progress.SECONDS in these tests


@pytest.fixture(autouse=True)
def short_cadence(monkeypatch):
    monkeypatch.setattr(progress, "SECONDS", BEAT)


def slowed(monkeypatch, owner, name: str, seconds=0.3):
    """`owner.name` taking `seconds` longer: a wait long enough for a few lines."""
    fn = getattr(owner, name)

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return fn(*args, **kwargs)

    monkeypatch.setattr(owner, name, slow)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny Home Depot cross-encoder run from a Hugging Face folder (BM25 and zero-shot
    baselines), the root logger's handlers restored after it."""
    handlers = logging.root.handlers[:]
    tmp = tmp_path_factory.mktemp("waits")
    tok = write_tokenizer(tmp / "tokenizer.json")
    write_hf_folder(tmp / "hf", tok)
    data = write_dataset(tmp / "hd", "home_depot")
    extra = [f"data_dir={data}", f"init_from={tmp / 'hf'}", f"paths.output_dir={tmp / 'run'}"]
    extra += [f"callbacks.progress_bar.seconds={BEAT}"]  # the run's cadence
    cfg = compose("finetune", overrides(tmp, "ad_relevance", "dataset=home_depot", *extra))
    logging.root.handlers[:] = handlers
    return tmp, cfg


def test_the_outermost_wait_speaks_naming_the_step_under_way(capsys):
    with progress.Waiting("outer"):
        time.sleep(0.3)
        with progress.Waiting("inner"):
            time.sleep(0.3)
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "outer ..." and "inner ..." not in err  # a step of it: no line of its own
    assert err.count("outer: 0m00s so far") >= 3
    assert err.count("outer: 0m00s so far (now: inner)") >= 3


def test_a_fine_tuning_runs_test_and_baselines_say_what_they_wait_on(run, capsys, monkeypatch):
    tmp, cfg = run
    slowed(monkeypatch, ad_relevance, "bm25_scores")
    handlers = logging.root.handlers[:]
    results = finetune(cfg)
    logging.root.handlers[:] = handlers
    err = capsys.readouterr().err
    n = results["rows"]["test"]
    for line in (
        f"testing {results['best_checkpoint']} on {n} test rows ...",
        f"the BM25 baseline of {n} test rows ...",
        f"the BM25 baseline of {n} test rows: 0m00s so far",
        f"the zero-shot baseline of {n} test rows (its encoder's cosines) ...",
        f"the fine-tuned model's scores of {n} test rows ...",
        "the ranking of ",
    ):
        assert line in err, line


def best(run):
    """The run's best checkpoint (fine-tuned here unless a test of this module did)."""
    tmp, cfg = run
    if not (tmp / "run" / "results.json").is_file():
        handlers = logging.root.handlers[:]
        finetune(cfg)
        logging.root.handlers[:] = handlers
    return next((tmp / "run" / "checkpoints").glob("best-step*.ckpt"))


def test_evaluate_says_what_it_waits_on_off_a_terminal(run, capsys, monkeypatch):
    tmp, cfg = run
    ckpt, test = best(run), cfg.task.train_file  # a file in the task's format
    slowed(monkeypatch, ad_relevance, "bm25_scores")
    capsys.readouterr()
    main(["evaluate", str(ckpt), test, "--zero-shot", str(tmp / "hf")])
    out, err = capsys.readouterr()
    assert f"{ckpt} on {test} ..." in err.splitlines()
    assert f"{ckpt} on {test}: 0m00s so far (now: the BM25 baseline of " in err
    assert "evaluate:" not in err  # tqdm's bar, off a terminal: none
    assert "zero_shot" in out and "..." not in out  # stdout: the metrics alone


def test_each_alpha_of_interpolate_says_what_it_scores(run, capsys, monkeypatch, tmp_path):
    ckpt = best(run)
    slowed(monkeypatch, interpolate, "table_metrics", 0.15)
    main(["interpolate", str(ckpt), str(tmp_path / "mixed.ckpt"), "--write-anyway"])
    err = capsys.readouterr().err
    for a in interpolate.ALPHAS:
        wait = rf"alpha {a:.1f}: validation spearman on \d+ rows of the run's validation split"
        assert re.search(rf"^{wait} \.\.\.$", err, re.M) and re.search(
            rf"^{wait}: 0m00s so far$", err, re.M
        )


def test_a_downstream_cell_is_not_silent_while_it_runs(tmp_path, capsys, monkeypatch):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "ours.ckpt", tok)
    write_dataset(tmp_path / "data" / "glue_sst2", "sst2")

    def cell(cfg, key, folder):  # the cell's fine-tuning, its time only
        time.sleep(0.3)
        return {"test": {"test/acc": 0.5}}

    monkeypatch.setattr(downstream, "run_cell", cell)
    main(
        [
            "downstream",
            f"ours={tmp_path / 'ours.ckpt'}",
            "--data-dir",
            str(tmp_path / "data"),
            "--budget",
            str(tiny_budget(tmp_path / "tiny.yaml")),
            "--out",
            str(tmp_path / "suite"),
            "--tasks",
            "sst2",
            "--seeds",
            "1",
            "--no-random",
        ]
    )
    out, err = capsys.readouterr()
    assert "[1/1] ours sst2 seed 1: fine-tuning ..." in err.splitlines()
    assert "[1/1] ours sst2 seed 1: fine-tuning: 0m00s so far" in err
    assert [ln for ln in out.splitlines() if ln.startswith("[")][0].startswith(
        "[1/1] ours sst2 seed 1: acc 0.5000"
    )  # stdout: a line per cell, as before


def test_building_the_examples_speaks_between_its_steps(tmp_path, monkeypatch, capsys):
    """Reading, tokenizing and framing a corpus: `datasets`' maps count their documents in
    their own processes; the build around them says it is under way whenever they do not."""
    from bert_lightning.data.pretraining import PretrainDataModule
    from helpers import data_module, write_corpus

    slowed(monkeypatch, PretrainDataModule, "build")
    corpus = write_corpus(tmp_path / "corpus.jsonl", 30)
    files = {"train_files": str(corpus), "cache_dir": str(tmp_path / "cache"), "val_docs": 5}
    data_module("corpus", **files).setup()
    err = capsys.readouterr().err.splitlines()
    assert "building the examples ..." in err
    assert err.count("building the examples: 0m00s so far") >= 3


def test_a_runs_cadence_is_its_own_progress_bar_seconds(tmp_path, monkeypatch, capsys):
    """`callbacks.progress_bar.seconds` of the run sets the cadence of the waits it starts
    too, not only its step and validation lines (the shipped value here made 1000 s)."""
    from bert_lightning.data.pretraining import PretrainDataModule
    from bert_lightning.training.pretrain import train
    from helpers import tiny_overrides, write_corpus

    monkeypatch.setattr(progress, "SECONDS", 1000.0)
    slowed(monkeypatch, PretrainDataModule, "build")
    write_corpus(tmp_path / "corpus.jsonl", 60)
    seconds = f"callbacks.progress_bar.seconds={BEAT}"
    train(compose(overrides=tiny_overrides(tmp_path, seconds, "trainer.max_steps=1")))
    assert capsys.readouterr().err.count("building the examples: 0m00s so far") >= 3
    assert progress.SECONDS == 1000.0  # the process's again after the run


def test_a_cadence_of_zero_speaks_at_most_each_poll_and_a_negative_is_one_line():
    """`callbacks.progress_bar.seconds=0` (a line at every count): the waits' thread spun on
    `wait(0)`, 35,488 lines in 0.3 s; a negative value spun until the bar refused it."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), progress.cadence(0), progress.Waiting("building"):
        time.sleep(0.3)
    assert 2 <= err.getvalue().count("building: 0m00s so far") <= 0.3 / progress.POLL + 1
    refused = r"^callbacks.progress_bar.seconds=-1; expected a number >= 0$"
    with pytest.raises(UserError, match=refused), progress.cadence(-1):
        pass
