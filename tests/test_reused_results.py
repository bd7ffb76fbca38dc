"""Results reused, by `interpolate` and the downstream suite's cells: a start that is not the one a
model was fine-tuned from (another tokenizer, or the same file moved on) is refused, and a
finished cell is reused only for the weights, settings and data it was run with. Beside them,
the other results reused outside the data layer (bench's budgeted pretraining runs, the random
row's tokenizer), each shown missed when one of its inputs changes."""

import json
import logging
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
import yaml
from tokenizers import Tokenizer

from bert_lightning.checkpoint import read_checkpoint, write_model
from bert_lightning.cli import main
from bert_lightning.commands.interpolate import interpolate
from bert_lightning.config import compose
from bert_lightning.experiments.downstream import BUDGETS, pretrained_models
from bert_lightning.fingerprints import file_digest
from bert_lightning.model import BertForPreTraining
from bert_lightning.training.finetune import finetune
from finetune_fixtures import (
    finetuned_ckpt,
    overrides,
    task_files,
    tiny_budget,
    tiny_config,
    write_dataset,
    write_hf_folder,
    write_our_ckpt,
    write_tokenizer,
)
from helpers import ROOT, cli_error


def pretrained_at(path, tok, step: int) -> None:
    """A pretraining `.ckpt` at `step`, its weights drawn from that step (another step, other
    weights)."""
    torch.manual_seed(step)
    config = tiny_config(tok.get_vocab_size())
    state = {f"model.{k}": v for k, v in BertForPreTraining(config).state_dict().items()}
    write_model(path, {"config": asdict(config)}, state, tok.to_str(), global_step=step)


def reversed_ids(tok) -> tuple[Tokenizer, int]:
    """`tok`'s tokens under other ids (the special tokens kept): a vocabulary of the same size,
    so every shape matches; and how many ids now name another token."""
    raw = json.loads(tok.to_str())
    vocab = raw["model"]["vocab"]
    words = [w for w in vocab if not w.startswith("[")]
    ids = [vocab[w] for w in words]
    moved = sum(vocab[w] != i for w, i in zip(words, reversed(ids), strict=True))
    vocab.update(zip(words, reversed(ids), strict=True))
    return Tokenizer.from_str(json.dumps(raw)), moved


def test_a_start_with_another_tokenizer_is_one_line(tmp_path, capsys):
    """Row 7a: the same shapes are not the same start: 556 of 600 ids named other tokens."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, "task=ad_relevance")
    other, moved = reversed_ids(tok)
    assert moved > 100 and other.get_vocab_size() == tok.get_vocab_size()
    write_hf_folder(tmp_path / "other", other)
    out = tmp_path / "o.ckpt"
    err = cli_error(
        capsys, "interpolate", ckpt, out, "--alpha", "0.5", "--start", tmp_path / "other"
    )
    assert err == (
        f"error: Hugging Face folder {tmp_path / 'other'} is not where checkpoint {ckpt} started: "
        f"{moved} of {tok.get_vocab_size()} token ids name other tokens in its tokenizer "
        "(interpolating would average their embeddings)"
    )
    assert not out.exists()


@pytest.fixture
def run_from_step_6(tmp_path):
    """A fine-tuning run from a pretraining checkpoint at step 6; its best checkpoint."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    pretrained_at(tmp_path / "pt.ckpt", tok, 6)
    extra = [*task_files(tmp_path, "seq_classification"), f"init_from={tmp_path / 'pt.ckpt'}"]
    finetune(compose("finetune", overrides(tmp_path, "seq_classification", *extra)))
    return tok, next((tmp_path / "run/checkpoints").glob("best-step*.ckpt"))


def test_a_start_that_moved_on_since_fine_tuning_is_one_line(tmp_path, run_from_step_6, capsys):
    """Row 7b: the run's `init_from=` file went on training (step 6 -> 9); interpolating from
    it gave step 9's weights. The checkpoint records its start; a changed one is refused, the
    file as it was (`--start`) is taken."""
    tok, ckpt = run_from_step_6
    start = tmp_path / "pt.ckpt"
    kept = tmp_path / "step6.ckpt"
    kept.write_bytes(start.read_bytes())
    pretrained_at(start, tok, 9)  # the pretraining run went on in place
    out = tmp_path / "o.ckpt"
    assert cli_error(capsys, "interpolate", ckpt, out, "--alpha", "0") == (
        f"error: {start}: changed since {ckpt} was fine-tuned from it (step 6 then, step 9 now: "
        "other weights); give --start with the weights it started from"
    )
    pretrained_at(tmp_path / "other.ckpt", tok, 6)  # the step, other weights
    assert cli_error(
        capsys, "interpolate", ckpt, out, "--alpha", "0", "--start", tmp_path / "other.ckpt"
    ) == (
        f"error: {tmp_path / 'other.ckpt'} is not where {ckpt} started ({start} at step 6): "
        "step 6, other weights"
    )
    assert not out.exists()
    interpolate(str(ckpt), str(out), alpha=0.0, start=str(kept))  # a copy of the start: taken
    zero, step6 = read_checkpoint(out).state_dict, read_checkpoint(kept).state_dict
    assert all(torch.equal(v, step6[k]) for k, v in zero.items() if k.startswith("bert."))
    record = read_checkpoint(ckpt).hparams["start"]
    assert record == {
        "path": str(start),
        "digest": file_digest(kept),
        "step": 6,
        "source": f"checkpoint {start}",
    }


def test_a_checkpoint_without_a_record_of_its_start_says_it_cannot_check(tmp_path, caplog):
    """Checkpoints fine-tuned before they recorded their start: interpolated, with a warning."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, "task=ad_relevance")
    write_hf_folder(tmp_path / "hf", tok)
    with caplog.at_level(logging.WARNING, "bert_lightning.commands.interpolate"):
        interpolate(str(ckpt), str(tmp_path / "o.ckpt"), alpha=0.5, start=str(tmp_path / "hf"))
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [
        f"{ckpt} records no start (fine-tuned before checkpoints did): that {tmp_path / 'hf'} "
        "is where it started cannot be checked"
    ]
    assert (tmp_path / "o.ckpt").is_file()


@pytest.mark.slow
def test_a_finished_cell_is_reused_only_with_its_weights_settings_and_data(tmp_path, capsys):
    """Row 11: `ours=pt1 --budget A`, then `ours=pt2 --budget B` into the same --out reported
    pt1's cell under B. A cell keeps the key of what it ran with; any change re-runs it."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "pt1.ckpt", tok)
    write_our_ckpt(tmp_path / "pt2.ckpt", tok)
    data = write_dataset(tmp_path / "data/glue_sst2", "sst2")
    a = tiny_budget(tmp_path / "a.yaml")
    b = tmp_path / "b.yaml"
    raw = yaml.safe_load(a.read_text())
    raw["tasks"]["sst2"]["lr"] = 1e-2
    b.write_text(yaml.safe_dump(raw, sort_keys=False))
    cell = tmp_path / "suite/cells/ours/sst2/seed1"

    def lines(model, budget) -> list[str]:
        capsys.readouterr()
        main(
            [
                "downstream",
                f"ours={model}",
                *["--data-dir", str(tmp_path / "data"), "--budget", str(budget)],
                *["--out", str(tmp_path / "suite"), "--seeds", "1", "--tasks", "sst2"],
                "--no-random",
            ]
        )
        out = capsys.readouterr().out.splitlines()
        return [ln.split(" (")[0].split(": acc")[0] for ln in out if ln.startswith("[")]

    assert lines(tmp_path / "pt1.ckpt", a) == ["[1/1] ours sst2 seed 1"]
    assert lines(tmp_path / "pt1.ckpt", a) == []  # the same cell: reused
    # the case: another checkpoint and another budget
    assert lines(tmp_path / "pt2.ckpt", b) == [
        "[1/1] ours sst2 seed 1: finished with other weights, settings: re-running",
        "[1/1] ours sst2 seed 1",
    ]
    cfg = yaml.safe_load((cell / "config_resolved.yaml").read_text())
    assert cfg["init_from"] == str(tmp_path / "pt2.ckpt") and cfg["optim"]["lr"] == 1e-2
    results = json.loads((cell / "results.json").read_text())
    report = json.loads((tmp_path / "suite/downstream.json").read_text())
    assert report["models"]["ours"]["cells"]["sst2"]["1"] == results["test"]["test/acc"]
    assert report["models"]["ours"]["digest"] == file_digest(tmp_path / "pt2.ckpt")
    # each input in turn: the checkpoint rewritten in place, a data file edited
    write_our_ckpt(tmp_path / "pt2.ckpt", tok)
    assert lines(tmp_path / "pt2.ckpt", b)[0].endswith("finished with other weights: re-running")
    (data / "dev.tsv").write_text((data / "dev.tsv").read_text() + "the film was good\t1\n")
    assert lines(tmp_path / "pt2.ckpt", b)[0].endswith("finished with other data: re-running")
    assert lines(tmp_path / "pt2.ckpt", a)[0].endswith("finished with other settings: re-running")
    assert lines(tmp_path / "pt2.ckpt", a) == []


def test_a_resumed_run_keeps_the_record_of_where_it_started(tmp_path, run_from_step_6):
    """`ckpt_path=` reads no start: the continued run's checkpoints carry its first part's."""
    _, ckpt = run_from_step_6
    last = tmp_path / "run/checkpoints/last.ckpt"
    extra = [*task_files(tmp_path, "seq_classification"), f"ckpt_path={last}"]
    extra += ["trainer.max_epochs=3", f"paths.output_dir={tmp_path / 'more'}"]
    finetune(compose("finetune", overrides(tmp_path, "seq_classification", *extra)))
    resumed = read_checkpoint(tmp_path / "more/checkpoints/last.ckpt")
    assert resumed.step > read_checkpoint(last).step
    assert resumed.hparams["start"] == read_checkpoint(ckpt).hparams["start"]


@pytest.mark.slow
def test_the_suites_ranking_table_is_of_its_own_cells(tmp_path, capsys):
    """downstream.md describes the suite that wrote it: another suite's cells in the same --out
    are not in its ranking table (`--ranking` with no MODEL tables every cell of --out)."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    write_dataset(tmp_path / "data/home_depot", "home_depot")
    budget = tiny_budget(tmp_path / "tiny.yaml", BUDGETS / "home_depot_ranking.yaml")
    for name in ("first", "second"):
        main(
            [
                "downstream",
                f"{name}={tmp_path / 'hf'}",
                *["--data-dir", str(tmp_path / "data"), "--budget", str(budget)],
                *["--out", str(tmp_path / "suite"), "--seeds", "1", "--tasks", "bi_lambda"],
                *["--no-random", "--ranking", "zero_shot"],
            ]
        )

    def starts(table: str) -> list[str]:
        return [ln.split(" | ")[0] for ln in table.splitlines() if " | bi_lambda | 1 | " in ln]

    assert starts((tmp_path / "suite/downstream.md").read_text()) == ["| second"]
    capsys.readouterr()
    main(["downstream", "--out", str(tmp_path / "suite"), "--ranking", "zero_shot"])
    assert starts(capsys.readouterr().out) == ["| first", "| second"]


def test_a_budgeted_pretraining_run_is_reused_only_with_its_settings(tmp_path, monkeypatch, capsys):
    """bench/budget_runs.py's `pretrain` (budget_curve, ablate): `OUT/<name>/` finished with
    other overrides, minutes or trainer is pretrained again, not read as this run."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import budget_runs

    ran = []

    def train(cmd, **_):  # stands for train.py: a run writes its last.ckpt
        ran.append(cmd)
        out = next(a for a in cmd if a.startswith("paths.output_dir=")).split("=", 1)[1]
        (Path(out) / "checkpoints").mkdir(parents=True, exist_ok=True)
        (Path(out) / "checkpoints/last.ckpt").write_text(str(len(ran)))

    monkeypatch.setattr(budget_runs.subprocess, "run", train)
    folder = tmp_path / "ours_1min"
    for trainer, minutes, extra, runs, redone in (
        ("ours", 1.0, ["optim.lr=1e-3"], 1, False),
        ("ours", 1.0, ["optim.lr=1e-3"], 1, False),  # the same: reused
        ("ours", 1.0, ["optim.lr=2e-3"], 2, True),
        ("ours", 2.0, ["optim.lr=2e-3"], 3, True),
        ("rtd", 2.0, ["optim.lr=2e-3"], 4, True),
    ):
        capsys.readouterr()
        model = budget_runs.pretrain(trainer, folder, minutes, extra)
        assert len(ran) == runs and model.read_text() == str(runs)
        printed = capsys.readouterr().out
        assert ("ours_1min: started with other settings: pretraining again" in printed) == redone
        assert f"trainer.max_time={budget_runs.max_time(minutes)}" in ran[-1]


def test_the_random_rows_tokenizer_file_is_named_by_what_it_holds(tmp_path):
    """The random row's tokenizer, written once under `<out>/random/<key>/`: a model of the same
    shape with another tokenizer gets its own file, never the first one's (another shape:
    test_downstream.py::test_the_random_row_has_the_shape_of_the_model)."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    other, _ = reversed_ids(tok)
    write_hf_folder(tmp_path / "a", tok)
    write_hf_folder(tmp_path / "b", other)
    for _ in range(2):  # the second suite finds the files written
        models = pretrained_models([str(tmp_path / "a"), str(tmp_path / "b")], tmp_path, True)
        assert [m.name for m in models] == ["a", "b", "random-a", "random-b"]
        saved = [
            o.split("=", 1)[1]
            for m in models[2:]
            for o in m.overrides
            if "data.tokenizer.path=" in o
        ]
        assert saved[0] != saved[1]
        for path, want in zip(saved, (tok, other), strict=True):
            assert Tokenizer.from_file(path).get_vocab() == want.get_vocab()


def test_the_validation_split_is_drawn_again_only_from_the_files_it_was_drawn_from(
    tmp_path, run_from_step_6, capsys
):
    """The alpha is picked on the run's validation split, drawn again from its train file: the
    same rows reordered would draw another split, most of it rows the model trained on."""
    _, ckpt = run_from_step_6
    train = tmp_path / "train.csv"
    header, *rows = train.read_text().splitlines(keepends=True)
    train.write_text(header + "".join(reversed(rows)))
    out = tmp_path / "o.ckpt"
    assert cli_error(capsys, "interpolate", ckpt, out) == (
        f"error: {train}: not the task.train_file {ckpt} was fine-tuned with (its contents "
        "changed or it is gone), so the run's validation split cannot be drawn again; give "
        "--validation FILE"
    )
    assert not out.exists()
