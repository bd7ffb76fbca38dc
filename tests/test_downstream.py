"""`bert-lightning downstream`: cells as fine-tuning run folders, the random row, the table,
JSON and chart, and a half-done suite continued without re-running its finished cells."""

import json
import math
import statistics

import pytest
import yaml
from tokenizers import Tokenizer

from bert_lightning.cli import main
from bert_lightning.errors import UserError
from bert_lightning.experiments.downstream import (
    BUDGETS,
    Model,
    TaskBudget,
    ranking_row,
    ranking_table,
    score,
    summarise,
    table,
)
from finetune_fixtures import (
    tiny_budget,
    write_dataset,
    write_hf_folder,
    write_our_ckpt,
    write_tokenizer,
)
from helpers import ROOT, cli_error


@pytest.fixture
def suite(tmp_path):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "ours.ckpt", tok)
    write_hf_folder(tmp_path / "hf_bert", tok)
    for name, folder in (
        ("sst2", "glue_sst2"),
        ("cola", "glue_cola"),
        ("wnut17", "wnut17"),
        ("home_depot", "home_depot"),
    ):
        write_dataset(tmp_path / "data" / folder, name)
    return tmp_path


def run(tmp, *args, base="cpu"):
    main(
        [
            "downstream",
            f"ours={tmp / 'ours.ckpt'}",
            str(tmp / "hf_bert"),
            "--data-dir",
            str(tmp / "data"),
            "--budget",
            str(tiny_budget(tmp / "tiny.yaml", base)),
            "--out",
            str(tmp / "suite"),
            *args,
        ]
    )


@pytest.mark.slow
def test_every_model_on_every_task_beside_random_weights(suite, capsys):
    run(suite, "--seeds", "2", "--tasks", "sst2,wnut17,home_depot,cola")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert len(lines) == 3 * 4 * 2 and lines[0].startswith("[1/24] ours sst2 seed 1: acc ")
    assert "eta" in lines[0] and lines[-1].startswith("[24/24] random cola seed 2: mcc ")
    report = json.loads((suite / "suite/downstream.json").read_text())
    # the same shape and tokenizer: one random row, from random weights of that shape
    assert list(report["models"]) == ["ours", "hf_bert", "random"]
    cell = suite / "suite/cells/random/sst2/seed2"
    results = json.loads((cell / "results.json").read_text())
    assert results["init_from"] is None and (cell / "train.log").is_file()
    cfg = yaml.safe_load((cell / "config_resolved.yaml").read_text())
    assert cfg["model"]["hidden_size"] == 32 and cfg["seed"] == 2
    assert cfg["task"]["subsample"]["train"] == 40
    ours = report["models"]["ours"]
    values = [ours["cells"][t][s] for t in ("sst2", "wnut17", "home_depot", "cola") for s in "12"]
    seed1 = json.loads((suite / "suite/cells/ours/sst2/seed1/results.json").read_text())
    assert ours["cells"]["sst2"]["1"] == seed1["test"]["test/acc"]
    mean, std = ours["mean_std"]["sst2"]
    assert mean == pytest.approx(statistics.fmean(values[:2]))
    assert std == pytest.approx(statistics.stdev(values[:2]))
    per_seed = [statistics.fmean(values[i::2]) for i in range(2)]
    assert ours["average"] == pytest.approx(
        [statistics.fmean(per_seed), statistics.stdev(per_seed)]
    )
    md = (suite / "suite/downstream.md").read_text().splitlines()
    assert md[0] == "| model | SST-2 acc | WNUT-17 F1 | Home Depot Spearman | CoLA MCC | average |"
    assert md[2].startswith(f"| ours | {mean:.3f} ± {std:.3f} |")
    assert (suite / "suite/downstream.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_half_done_suite_runs_only_its_unfinished_cells(suite, capsys):
    run(suite, "--seeds", "1", "--tasks", "sst2", "--no-random")
    capsys.readouterr()
    finished = suite / "suite/cells/ours/sst2/seed1/results.json"
    before = finished.read_text()
    (suite / "suite/cells/hf_bert/sst2/seed1/results.json").unlink()  # stopped mid-cell
    run(suite, "--seeds", "1", "--tasks", "sst2", "--no-random")
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert [ln.split(":")[0] for ln in lines] == ["[2/2] hf_bert sst2 seed 1"]
    assert finished.read_text() == before
    assert list(json.loads((suite / "suite/downstream.json").read_text())["models"]) == [
        "ours",
        "hf_bert",
    ]


@pytest.mark.slow
def test_a_list_of_seeds_runs_those_seeds_a_seed_at_a_time(suite, capsys):
    """`--seeds 2,3`: a suite split over sessions or machines by seed; every cell of seed 2
    finishes before seed 3 starts, so a stopped suite leaves whole seeds."""
    run(suite, "--seeds", "2,3", "--tasks", "sst2,cola", "--no-random")
    lines = [ln.split(":")[0] for ln in capsys.readouterr().out.splitlines() if ln.startswith("[")]
    assert lines == [
        f"[{i}/8] {m} {t} seed {s}"
        for i, (s, m, t) in enumerate(
            ((s, m, t) for s in (2, 3) for m in ("ours", "hf_bert") for t in ("sst2", "cola")), 1
        )
    ]
    report = json.loads((suite / "suite/downstream.json").read_text())
    assert report["seeds"] == [2, 3] and list(report["models"]["ours"]["cells"]["sst2"]) == [
        "2",
        "3",
    ]
    cfg = yaml.safe_load((suite / "suite/cells/ours/cola/seed3/config_resolved.yaml").read_text())
    assert cfg["seed"] == 3 and not (suite / "suite/cells/ours/sst2/seed1").exists()


@pytest.mark.slow
def test_the_gpu_budget_steps_its_cells(suite, capsys):
    """experiments/budgets/gpu.yaml's cells (bf16-mixed) on the CPU, a few steps each."""
    run(suite, "--seeds", "1", "--no-random", base="gpu")
    report = json.loads((suite / "suite/downstream.json").read_text())
    assert list(report["tasks"]) == ["sst2", "cola", "wnut17", "home_depot"]
    cfg = yaml.safe_load((suite / "suite/cells/ours/cola/seed1/config_resolved.yaml").read_text())
    assert cfg["trainer"]["precision"] == "bf16-mixed"
    assert all(ln.startswith("[") for ln in capsys.readouterr().out.splitlines()[:8])


def test_mistakes_are_one_line(suite, capsys):
    for args, message in (
        (["--tasks", "sst2,mnli"], "--tasks mnli: not in budget"),
        (["--seeds", "0"], "--seeds 0; expected at least 1, or distinct seeds like 2,3"),
        (["--seeds", "2,2"], "--seeds 2,2; expected at least 1, or distinct seeds like 2,3"),
    ):
        with pytest.raises(SystemExit) as e:
            run(suite, *args)
        assert e.value.code == 2 and message in capsys.readouterr().err
    (suite / "data/wnut17/wnut17train.conll").unlink()
    (suite / "data/wnut17/emerging.dev.conll").unlink()
    (suite / "data/wnut17").rmdir()
    with pytest.raises(SystemExit):
        run(suite, "--tasks", "wnut17")
    err = capsys.readouterr().err
    assert err.startswith("error: --data-dir ") and "no folder wnut17/" in err
    assert not (suite / "suite").exists()  # nothing ran, nothing written


def test_the_random_row_has_the_shape_of_the_model(suite):
    """One random row per shape: two models of other shapes get one each, named after them."""
    from bert_lightning.experiments.downstream import pretrained_models

    tok = write_tokenizer(suite / "tokenizer.json")
    write_hf_folder(suite / "deeper", tok, layers=3)
    models = pretrained_models([str(suite / "hf_bert"), str(suite / "deeper")], suite / "o", True)
    assert [m.name for m in models] == ["hf_bert", "deeper", "random-hf_bert", "random-deeper"]
    assert "model.num_hidden_layers=3" in models[3].overrides
    assert "model.num_hidden_layers=2" in models[2].overrides
    saved = [p for p in models[2].overrides if p.startswith("data.tokenizer.path=")][0].split(
        "=", 1
    )[1]
    assert Tokenizer.from_file(saved).get_vocab() == tok.get_vocab()
    # an init is not a shape: a run started from sinusoidal positions shares BERT's random row
    write_our_ckpt(suite / "sin.ckpt", tok, position_embedding_init="sinusoidal")
    models = pretrained_models(
        [f"ours={suite / 'ours.ckpt'}", str(suite / "sin.ckpt")], suite, True
    )
    assert [m.name for m in models] == ["ours", "sin", "random"]
    assert not any("position_embedding_init" in o for o in models[2].overrides)


@pytest.mark.slow
def test_the_ranking_ablation_is_a_budget_and_its_table_reads_the_cells(suite, capsys):
    """--budget home_depot_ranking: each arm a task of the suite, every cell beside the zero-shot
    cosine of its start; --ranking tables the paired differences, in downstream.md too."""
    budget = tiny_budget(suite / "tiny.yaml", BUDGETS / "home_depot_ranking.yaml")
    main(
        [
            "downstream",
            f"start={suite / 'hf_bert'}",
            *["--data-dir", str(suite / "data"), "--budget", str(budget), "--no-random"],
            *["--tasks", "cross_distill,bi_lambda", "--out", str(suite / "abl")],
            *["--ranking", "zero_shot"],
        ]
    )
    cell = json.loads((suite / "abl/cells/start/bi_lambda/seed1/results.json").read_text())
    paired = cell["ranking"]["fine-tuned - zero_shot"]["ndcg@10"]["queries"]
    assert paired == cell["ranking"]["zero_shot"]["ndcg@10"]["queries"] > 0
    lines = ranking_table(suite / "abl", "zero_shot").splitlines()
    assert [line.split(" | ")[:3] for line in lines[2:]] == [
        ["| start", "bi_lambda", "3"],
        ["| start", "cross_distill", "3"],
    ]
    assert lines[2].count("above 0)") == 2
    assert "\n".join(lines) in (suite / "abl/downstream.md").read_text()
    capsys.readouterr()
    with pytest.raises(SystemExit, match="2"):  # bm25's figures are there too; a typo is not
        main(["downstream", "--out", str(suite / "abl"), "--ranking", "bm2"])
    assert "invalid choice: 'bm2'" in capsys.readouterr().err


def test_a_cell_with_the_old_per_query_names_is_one_line(tmp_path):
    """A cell whose results.json has per-query `spearman` (before `query_spearman`) is named,
    not a KeyError: it is to be run again."""
    cell = tmp_path / "cells/m/home_depot/seed1"
    cell.mkdir(parents=True)
    diff = {"mean": 0.1, "low": 0.0, "high": 0.2, "queries": 3}
    old = {"ranking": {"fine-tuned - zero_shot": {"spearman": diff, "ndcg@10": diff}}}
    (cell / "results.json").write_text(json.dumps(old))
    with pytest.raises(UserError) as e:
        ranking_table(tmp_path, "zero_shot")
    assert str(e.value) == (
        f"--ranking: {cell / 'results.json'} has no query_spearman (a cell written before the "
        "per-query correlations were named query_*); run it again"
    )


def test_the_ranking_table_gives_one_seeds_interval_and_several_seeds_spread():
    def run(mean, low):
        diff = {"mean": mean, "low": low, "high": mean + 0.01, "queries": 9}
        test = {"test/spearman": 0.4, "test/auroc": 0.7}
        return {
            "ranking": {"fine-tuned - zero_shot": {"query_spearman": diff, "ndcg@10": diff}},
            "test": test,
        }

    one = ranking_row("s", "a", [run(0.02, 0.001)], "zero_shot")
    interval = "+0.0200 [+0.0010, +0.0300]"
    assert one == f"| s | a | 1 | {interval} | {interval} | 0.4000 | 0.7000 |"
    two = ranking_row("s", "a", [run(0.02, 0.001), run(0.04, -0.01)], "zero_shot")
    assert two.split(" | ")[3] == "+0.0300 ± 0.0141 (1/2 above 0)"


def test_a_nan_cell_stays_nan_in_the_table_and_the_average():
    """A NaN test metric (a correlation of constant scores) is no measured 0: its task's mean
    and the model's average are NaN ("nan" in the table); a model without one keeps its
    figures."""
    budget = dict(folder="f", rows=8, validation_rows=4, test_rows=None, epochs=1, lr=1e-3)
    budget |= dict(max_seq_length=32, batch_size=8)
    tasks = {
        "sst2": TaskBudget("sst2", metric="acc", label="SST-2", **budget),
        "stsb": TaskBudget("stsb", metric="spearman", label="STS-B", **budget),
    }
    models = [Model("ours", (), "ours.ckpt", "d1"), Model("random", (), "random", "d2")]
    cells = {"ours": (0.8, 0.6, 0.5, math.nan), "random": (0.7, 0.5, 0.3, 0.1)}
    scores = {}
    for name, (sst1, sst2, sts1, sts2) in cells.items():
        runs = {("sst2", 1): sst1, ("sst2", 2): sst2, ("stsb", 1): sts1, ("stsb", 2): sts2}
        for (t, s), v in runs.items():
            scores[name, t, s] = score({"test": {f"test/{tasks[t].metric}": v}}, tasks[t].metric)
    summary = summarise(models, tasks, [1, 2], scores)
    ours, random = summary["ours"], summary["random"]
    assert math.isnan(ours["cells"]["stsb"]["2"])
    assert ours["mean_std"]["sst2"] == pytest.approx((0.7, statistics.stdev([0.8, 0.6])))
    assert all(map(math.isnan, (*ours["mean_std"]["stsb"], *ours["average"])))
    assert random["average"] == pytest.approx((0.4, statistics.stdev([0.5, 0.3])))
    assert table(summary, tasks, [1, 2]).splitlines()[2:] == [
        "| ours | 0.700 ± 0.141 | nan | nan |",
        "| random | 0.600 ± 0.141 | 0.200 ± 0.141 | 0.400 ± 0.141 |",
    ]


def test_the_ablation_tables_in_the_docs_are_what_the_kept_cells_give(capsys):
    """docs/finetuning-results.md's ranking ablation tables are `downstream --ranking`'s output
    over the cells' results.json kept in bench/results/ranking_ablation: the figures are the
    files'."""
    doc = (ROOT / "docs/finetuning-results.md").read_text()
    for against in ("zero_shot", "bm25"):
        main(
            [
                "downstream",
                "--out",
                str(ROOT / "bench/results/ranking_ablation"),
                "--ranking",
                against,
            ]
        )
        assert capsys.readouterr().out.strip() in doc


def test_a_suite_folder_holding_a_link_is_refused(tmp_path, capsys):
    """The suite removes and rewrites its cells in --out: a link planted there (a downloaded
    folder reused) would take those deletes and writes elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out" / "cells"
    out.mkdir(parents=True)
    (out / "model").symlink_to(elsewhere)
    argv = ["downstream", "start=x", "--data-dir", tmp_path, "--out", tmp_path / "out"]
    line = cli_error(capsys, *argv)
    assert line == (
        f"error: {out / 'model'}: a symlink (to {elsewhere}) in --out {tmp_path / 'out'}; "
        "remove it, or give a new --out"
    )
