"""The golden loss curve: the default `python train.py` run's validation loss at fixed steps,
pinned, so that a change that breaks learning (masking, the model, the optimizer, the data)
fails CI. The first 200 of the default run's 600 steps, with `optim.total_steps=600` so that the
learning-rate schedule is the default run's own."""

import csv

import pytest

from bert_lightning.config import compose
from bert_lightning.training.pretrain import train

# the default run's validation MLM loss by logged step, recorded with the CPU build of torch that
# .ci/run pins: a torch upgrade may move it past the tolerance, and then the values are rerecorded
GOLDEN = {0: 9.0278, 100: 7.0972, 200: 6.9746}


@pytest.mark.slow
def test_default_run_follows_the_golden_curve(tmp_path):
    cfg = compose(
        overrides=[
            f"paths.output_dir={tmp_path}",
            "trainer.max_steps=200",
            "optim.total_steps=600",
            "trainer.enable_progress_bar=false",
            "trainer.enable_model_summary=false",
        ]
    )
    train(cfg)
    with open(tmp_path / "metrics.csv", newline="") as f:
        got = {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(f) if r["val/loss"]}
    assert got.keys() == GOLDEN.keys()
    for step, loss in GOLDEN.items():
        assert got[step] == pytest.approx(loss, abs=0.02), (step, got)
