"""`bert-lightning interpolate`: WiSE-FT's weights of a fine-tuned run, `(1 - a) * start + a *
fine-tuned`; at a = 1 the fine-tuned model, at a = 0 the start's encoder (a bi-encoder then
scores the start's zero-shot cosine); the best a on the run's validation split; the file loads
wherever a fine-tuned checkpoint does."""

import json
import logging
import math
import re

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.cli import main
from bert_lightning.commands import interpolate as command
from bert_lightning.commands.interpolate import ALPHAS, interpolate
from bert_lightning.config import compose
from bert_lightning.data.tokenizer import load_tokenizer
from bert_lightning.inference import load_finetuned, score_rows, table_metrics, zero_shot_cosines
from bert_lightning.serving import PairsRequest, ScorePairs
from bert_lightning.tasks.base import load_splits
from bert_lightning.tasks.kinds import make_task
from bert_lightning.training.finetune import finetune
from finetune_fixtures import (
    ad_rows,
    overrides,
    write_csv,
    write_dataset,
    write_hf_folder,
    write_tokenizer,
)
from helpers import cli_error

ROWS = [(r["query"], r["ad"]) for r in ad_rows(4)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two Home Depot runs from one tiny Hugging Face folder: a bi-encoder, a cross-encoder
    (the root logger's handlers restored after them, as conftest's `_root_log_handlers` does
    per test)."""
    handlers = logging.root.handlers[:]
    tmp = tmp_path_factory.mktemp("interpolate")
    tok = write_tokenizer(tmp / "tokenizer.json")
    write_hf_folder(tmp / "hf", tok)
    data = write_dataset(tmp / "hd", "home_depot")
    out = {}
    for arch in ("bi_encoder", "cross_encoder"):
        extra = [f"data_dir={data}", f"init_from={tmp / 'hf'}", f"task.architecture={arch}"]
        extra += ["optim.lr=1e-2", f"paths.output_dir={tmp / arch}", "trainer.max_epochs=2"]
        finetune(compose("finetune", overrides(tmp, "ad_relevance", "dataset=home_depot", *extra)))
        out[arch] = next((tmp / arch / "checkpoints").glob("best-step*.ckpt"))
    logging.root.handlers[:] = handlers
    return tmp, out


def scores(path) -> torch.Tensor:
    ft = load_finetuned(path)
    return torch.tensor(score_rows(ft.model, ft.task, ft.tokenizer(), ROWS))


def test_alpha_one_is_the_fine_tuned_model_and_zero_its_start(runs, tmp_path):
    tmp, ckpts = runs
    ckpt = ckpts["bi_encoder"]
    interpolate(str(ckpt), str(tmp_path / "one.ckpt"), alpha=1.0)
    assert torch.equal(scores(tmp_path / "one.ckpt"), scores(ckpt))
    interpolate(str(ckpt), str(tmp_path / "zero.ckpt"), alpha=0.0)
    zero, start = read_checkpoint(tmp_path / "zero.ckpt"), read_checkpoint(tmp / "hf")
    tuned = read_checkpoint(ckpt)
    assert tuned.state_dict.keys() == zero.state_dict.keys()
    for key, value in zero.state_dict.items():
        want = start.state_dict[key] if key.startswith("bert.") else tuned.state_dict[key]
        assert torch.equal(value, want), key
    # the start's encoder under the fine-tuned head: sigmoid(w x the zero-shot cosine + b)
    w, b = (float(tuned.state_dict[f"classifier.{k}"]) for k in ("weight", "bias"))
    cos = zero_shot_cosines(tmp / "hf", ROWS, max_seq_length=48)  # (N,)
    assert w != 20.0  # the head was trained
    want = torch.sigmoid(w * cos + b)  # (N,)
    torch.testing.assert_close(scores(tmp_path / "zero.ckpt"), want, atol=1e-6, rtol=0)
    interpolate(str(ckpt), str(tmp_path / "half.ckpt"), alpha=0.5)
    half = read_checkpoint(tmp_path / "half.ckpt")
    key = "bert.encoder.layer.0.attention.self.qkv.weight"
    torch.testing.assert_close(
        half.state_dict[key], (start.state_dict[key] + tuned.state_dict[key]) / 2
    )


def test_the_sweep_writes_the_best_alpha_on_the_runs_validation_split(runs, tmp_path, capsys):
    tmp, ckpts = runs
    ckpt = ckpts["cross_encoder"]
    main(["interpolate", str(ckpt), str(tmp_path / "best.ckpt"), "--write-anyway"])  # a = 1 too
    printed = capsys.readouterr().out
    report = torch.load(tmp_path / "best.ckpt", weights_only=True)["interpolation"]
    assert report["metric"] == "spearman" and list(report["validation"]) == ALPHAS
    best = max(ALPHAS, key=lambda a: (report["validation"][a], a))
    assert report["alpha"] == best and printed.splitlines()[-1] == (
        f"alpha {best:.2f} from {tmp / 'hf'} (best validation spearman "
        f"{report['validation'][best]:.4f}, {report['data']}) -> {tmp_path / 'best.ckpt'}"
    )
    # each score is the validation split's metric, as the run's own validation computes it
    cfg = compose("finetune", overrides(tmp, "ad_relevance", "dataset=home_depot",
                                        f"data_dir={tmp / 'hd'}"))  # fmt: skip
    _, tables = load_splits(make_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.seed)
    one = table_metrics(load_finetuned(ckpt), tables["validation"])["spearman"]
    assert report["validation"][1.0] == pytest.approx(one, abs=1e-6)
    assert (
        report["data"] == f"{len(tables['validation']['text'])} rows of the run's validation split"
    )


def test_a_sweep_that_picks_one_says_so_and_writes_nothing_unless_asked(
    runs, tmp_path, capsys, monkeypatch
):
    """a = 1 is the fine-tuned model as it is: a copy of it is written only when asked."""
    tmp, ckpts = runs
    ckpt, out = ckpts["cross_encoder"], tmp_path / "best.ckpt"
    rising = iter(ALPHAS)  # each alpha's score is the alpha: a = 1 is the best
    monkeypatch.setattr(command, "table_metrics", lambda model, table: {"spearman": next(rising)})
    main(["interpolate", str(ckpt), str(out)])
    printed = capsys.readouterr().out.splitlines()
    assert re.fullmatch(
        rf"alpha 1\.00 from {re.escape(str(tmp / 'hf'))} \(best validation spearman 1\.0000, "
        r"\d+ rows of the run's validation split\): the fine-tuned model is best as it is; "
        r"nothing written \(--write-anyway: its copy\)",
        printed[-1],
    )
    assert not out.exists()
    rising = iter(ALPHAS)
    main(["interpolate", str(ckpt), str(out), "--write-anyway"])
    assert capsys.readouterr().out.splitlines()[-1].endswith(f"-> {out}")
    assert torch.load(out, weights_only=True)["interpolation"]["alpha"] == 1.0
    falling = iter(reversed(ALPHAS))  # a = 0 is the best: written without asking
    monkeypatch.setattr(command, "table_metrics", lambda model, table: {"spearman": next(falling)})
    main(["interpolate", str(ckpt), str(tmp_path / "zero.ckpt")])
    assert capsys.readouterr().out.splitlines()[-1].startswith("alpha 0.00 from ")
    assert torch.load(tmp_path / "zero.ckpt", weights_only=True)["interpolation"]["alpha"] == 0.0


def test_an_interpolated_checkpoint_scores_exports_and_serves(runs, tmp_path):
    tmp, ckpts = runs
    out = tmp_path / "mixed.ckpt"
    interpolate(str(ckpts["cross_encoder"]), str(out), alpha=0.5)
    want = scores(out)
    rows = [{"search_term": q, "product_title": a} for q, a in ROWS]  # dataset=home_depot's
    write_csv(tmp_path / "rows.csv", rows)
    main(["score", str(out), str(tmp_path / "rows.csv"), str(tmp_path / "scored.csv")])
    assert pd.read_csv(tmp_path / "scored.csv")["score"].tolist() == pytest.approx(
        want.tolist(), abs=1e-6
    )
    main(["export-hf", str(out), str(tmp_path / "hf")])
    assert json.loads((tmp_path / "hf/config.json").read_text())["architectures"] == [
        "BertForSequenceClassification"
    ]
    pytest.importorskip("onnxruntime")
    main(["export-onnx", str(out), str(tmp_path / "onnx")])
    assert (scores(tmp_path / "onnx") - want).abs().max() <= 1e-4
    api = ScorePairs(str(out), 8, 0.0, 1)
    api.setup("cpu")
    pairs = [{"query": q, "ad": a} for q, a in ROWS]
    reply = api.predict([api.decode_request(PairsRequest(pairs=pairs))])[0]
    assert reply.body["scores"] == pytest.approx(want.tolist(), abs=1e-5)


def test_a_nan_score_is_never_the_best_alpha(runs, tmp_path, capsys, monkeypatch):
    """alpha 0 scored NaN (a degenerate metric) and the others 0.9 down to 0.0: 0.1 is picked,
    where `max` would keep a leading NaN; all NaN is one line."""
    tmp, ckpts = runs
    ckpt, out = ckpts["cross_encoder"], tmp_path / "best.ckpt"
    scores = iter([math.nan, *reversed(ALPHAS[:-1])])
    monkeypatch.setattr(command, "table_metrics", lambda model, table: {"spearman": next(scores)})
    main(["interpolate", str(ckpt), str(out)])
    assert capsys.readouterr().out.splitlines()[-1].startswith("alpha 0.10 from ")
    assert torch.load(out, weights_only=True)["interpolation"]["alpha"] == 0.1
    monkeypatch.setattr(command, "table_metrics", lambda model, table: {"spearman": math.nan})
    err = cli_error(capsys, "interpolate", str(ckpt), str(tmp_path / "none.ckpt"))
    assert re.fullmatch(
        r"error: validation spearman is NaN at every alpha \(\d+ rows of the run's validation "
        r"split\): none to pick",
        err,
    )
    assert not (tmp_path / "none.ckpt").exists()


def test_a_start_that_is_not_known_or_not_the_start_is_one_line(runs, tmp_path, capsys):
    tmp, ckpts = runs
    moved = tmp_path / "moved.ckpt"  # out of its run folder: the start it records still holds
    moved.write_bytes(ckpts["cross_encoder"].read_bytes())
    report = interpolate(str(moved), str(tmp_path / "half.ckpt"), alpha=0.5)
    assert report["start"] == str(tmp / "hf") and (tmp_path / "half.ckpt").is_file()
    other = tmp_path / "other"
    write_hf_folder(other, load_tokenizer(tmp / "tokenizer.json"), layers=1)
    err = cli_error(
        capsys,
        "interpolate",
        str(moved),
        str(tmp_path / "o.ckpt"),
        "--alpha",
        "0.5",
        "--start",
        str(other),
    )
    assert err == (
        f"error: {other} is not where {moved} started ({tmp / 'hf'} at step 0): step 0, "
        "other weights"
    )
    # a checkpoint with no record of its start (fine-tuned before they kept one): the shapes
    raw = torch.load(moved, weights_only=True)
    raw["hyper_parameters"]["start"] = {"digest": "0" * 64}  # a crafted record: one line
    torch.save(raw, moved)
    assert cli_error(capsys, "interpolate", moved, tmp_path / "o.ckpt", "--alpha", "0.5") == (
        f"error: {moved}: hyper_parameters.start has no path"
    )
    raw["hyper_parameters"]["start"] = {"path": ["x"], "digest": "0" * 64}
    torch.save(raw, moved)
    assert cli_error(capsys, "interpolate", moved, tmp_path / "o.ckpt", "--alpha", "0.5") == (
        f"error: {moved}: hyper_parameters.start.path: expected str, got ['x']"
    )
    raw["hyper_parameters"]["start"] = {"path": str(tmp_path / "gone"), "digest": "0" * 64}
    torch.save(raw, moved)
    assert cli_error(capsys, "interpolate", moved, tmp_path / "o.ckpt", "--alpha", "0.5") == (
        f"error: {moved}: started from {tmp_path / 'gone'} (its record), which is not there "
        "now; give --start with where it is"
    )
    del raw["hyper_parameters"]["start"]
    torch.save(raw, moved)
    assert cli_error(capsys, "interpolate", moved, tmp_path / "o.ckpt", "--alpha", "0.5") == (
        f"error: {moved}: where its weights started is not known (it records no start: random "
        "weights, or fine-tuned before checkpoints kept one); give --start"
    )
    err = cli_error(
        capsys, "interpolate", moved, tmp_path / "o.ckpt", "--alpha", "0.5", "--start", other
    )
    assert err == (
        f"error: Hugging Face folder {other} is not where checkpoint {moved} started: its "
        "bert.encoder.layer.1.attention.self.qkv.weight is none, the fine-tuned one (96, 32)"
    )
    assert not (tmp_path / "o.ckpt").exists()


def test_a_validation_file_with_a_column_named_otherwise_names_the_fix(runs, tmp_path, capsys):
    """interpolate maps no column: the message named `task.query_column=NAME`, which it does
    not take."""
    import pandas as pd

    tmp, ckpts = runs
    ads = tmp_path / "ads.csv"
    pd.DataFrame(ad_rows(2)).rename(columns={"query": "q"}).to_csv(ads, index=False)
    err = cli_error(
        capsys, "interpolate", ckpts["bi_encoder"], tmp_path / "o.ckpt", "--validation", ads
    )
    assert err == (  # the run's Home Depot columns
        f"error: {ads}: no column 'search_term'; the file has ['q', 'ad', 'label']: rename its "
        "column to 'search_term', as the run read it"
    )
