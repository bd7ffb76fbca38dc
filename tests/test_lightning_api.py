"""training/lightning_api.py, the one door to Lightning's private names: each function on a real
fit of the installed Lightning, each failing with one line naming the release and the name when
a release moves it. (tests/test_private_api.py: no other module touches such a name.)"""

import csv
import logging
import re
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.fabric.loggers.csv_logs import _ExperimentWriter
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, Timer
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.model_summary import model_summary
from torch.utils.data import DataLoader

from bert_lightning.training import lightning_api as api
from bert_lightning.training.callbacks import FlopFreeModelSummary
from helpers import PACKAGE

DOOR = PACKAGE / "training" / "lightning_api.py"


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).sum()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(16, 2), batch_size=1)


class Record(L.Callback):
    """What the door reads at each training batch's end."""

    def __init__(self):
        self.rows = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        logs = api.logs_this_step(trainer)
        self.rows.append((batch_idx, trainer.global_step, api.batches_stepped(trainer), logs))


def fit(tmp_path: Path, *callbacks, **kwargs) -> L.Trainer:
    trainer = L.Trainer(
        **{"max_steps": 3, "log_every_n_steps": 1, "logger": False, **kwargs},
        default_root_dir=tmp_path,
        callbacks=list(callbacks),
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
    )
    trainer.fit(Tiny())
    return trainer


def test_steps_and_log_rows_are_lightnings(tmp_path):
    """Accumulating 2 batches a step: the batches that stepped trail `global_step`, a row is
    written where the door says, at the step it says, and the rates are the monitor's."""
    record, monitor = Record(), LearningRateMonitor()
    logger = CSVLogger(tmp_path, name="", version="")
    trainer = fit(
        tmp_path,
        record,
        monitor,
        max_steps=5,
        log_every_n_steps=2,
        accumulate_grad_batches=2,
        logger=logger,
    )
    steps = [(global_step, stepped) for _, global_step, stepped, _ in record.rows]
    assert steps == [((i + 1) // 2, i // 2) for i in range(10)]
    assert [logs for *_, logs in record.rows] == [(s + 1) % 2 == 0 for _, s in steps]
    with open(logger.experiment.metrics_file_path, newline="") as f:
        logged = {int(row["step"]) for row in csv.DictReader(f) if row["loss"]}
    assert logged == {stepped for _, _, stepped, logs in record.rows if logs} == {1, 3}
    assert api.learning_rates(monitor, trainer) == {"lr-SGD": 0.1}


class SaveLastAtStep2(L.Callback):
    def __init__(self, ckpt: ModelCheckpoint):
        self.ckpt, self.saved = ckpt, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2 and not self.saved:
            last = Path(self.ckpt.dirpath) / "last.ckpt"
            api.save_last(self.ckpt, trainer)
            self.saved.append(torch.load(last, weights_only=False)["global_step"])
            last.unlink()
            api.save_last(self.ckpt, trainer)  # saved at this step already: nothing
            self.saved.append(last.exists())


def test_save_last_writes_once_a_step(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_top_k=0)
    saver = SaveLastAtStep2(ckpt)
    fit(tmp_path, ckpt, saver)
    assert saver.saved == [2, False]


class Stop(Exception):
    pass


class LogRowAtStep2(L.Callback):
    """Logs step 2's row in `on_train_batch_end`, then raises there as a stop does."""

    def __init__(self):
        self.rows = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == 2:
            rows = trainer.logger.experiment.metrics  # the logger's, not yet written
            before, stepped = len(rows), api.batches_stepped(trainer)
            api.log_step_row(trainer, outputs, batch, batch_idx)
            self.rows = [(r["step"], "loss" in r) for r in rows[before:]], stepped
            raise Stop


def test_log_step_row_logs_the_steps_row_before_lightning_would(tmp_path):
    logger = CSVLogger(tmp_path, name="", version="")
    record = LogRowAtStep2()
    with pytest.raises(Stop):
        fit(tmp_path, record, logger=logger, log_every_n_steps=1)
    assert record.rows == ([(1, True)], 1)


def test_save_deferred_is_the_flag_defer_save_sets():
    ckpt = ModelCheckpoint(monitor="val/loss")
    assert api.save_deferred(ckpt) is False
    api.defer_save(ckpt)
    assert api.save_deferred(ckpt) is True


class Validated(Tiny):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch).sum())

    def val_dataloader(self):
        return DataLoader(torch.randn(2, 2), batch_size=1)


class Due(L.Callback):
    """The steps the door says a validation follows, and those a validation followed."""

    def __init__(self):
        self.due, self.validated = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if api.validates_after_step(trainer):
            self.due.append(trainer.global_step)

    def on_validation_start(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.validated.append(trainer.global_step)


def test_validates_after_step_is_lightnings_decision(tmp_path):
    """Every third batch of an epoch of 5 (not at its end)."""
    due = Due()
    trainer = L.Trainer(
        **{"max_steps": 8, "limit_train_batches": 5, "val_check_interval": 3},
        default_root_dir=tmp_path,
        callbacks=[due],
        logger=False,
        accelerator="cpu",
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(Validated())
    assert due.due == due.validated == [3, 8]


def test_validation_progress_is_what_a_checkpoint_records_of_the_validation(tmp_path):
    trainer = L.Trainer(default_root_dir=tmp_path, logger=False, enable_checkpointing=False)
    progress = api.validation_progress(trainer)
    saved = trainer.fit_loop.state_dict()["epoch_loop.val_loop.batch_progress"]
    assert progress.state_dict() == saved and progress.total.completed == 0


def test_budget_seconds_is_the_timers_duration():
    timer = Timer(duration="00:00:01:30")
    assert api.budget_seconds(timer) == timer.time_remaining() == 90


def test_summary_table_is_lightnings_without_flops(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="bert_lightning.training.callbacks"):
        fit(tmp_path, FlopFreeModelSummary(), max_steps=1)
    table = caplog.text
    assert "Trainable params" in table and "layer" in table and "Linear" in table
    assert "flops" not in table.lower()


def test_appending_csv_experiment_continues_metrics_csv(tmp_path):
    logger = CSVLogger(tmp_path, name="run", version="v")
    (tmp_path / "run" / "v").mkdir(parents=True)
    (tmp_path / "run" / "v" / "metrics.csv").write_text("loss,step\n0.5,1\n")
    writer = api.appending_csv_experiment(logger)
    assert writer is api.appending_csv_experiment(logger) is logger.experiment
    writer.log_metrics({"loss": 0.25}, step=2)
    writer.save()
    assert Path(writer.metrics_file_path).read_text().split() == ["loss,step", "0.5,1", "0.25,2"]


MOVED = [  # (call on a stand-in that lacks the name, the name)
    (lambda: api.logs_this_step(object()), "object._logger_connector"),
    (
        lambda: api.batches_stepped(SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=1))),
        "int._batches_that_stepped",
    ),
    (
        lambda: api.validation_progress(SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=1))),
        "int.val_loop",
    ),
    (lambda: api.budget_seconds(object()), "object._duration"),
    (lambda: api.learning_rates(object(), None), "object._extract_stats"),
    (lambda: api.save_last(object(), None), "object._last_global_step_saved"),
    (
        lambda: api.log_step_row(
            SimpleNamespace(lightning_module=SimpleNamespace(on_train_batch_end=print)), *"ob", 0
        ),
        "SimpleNamespace._logger_connector",
    ),
    (lambda: api.save_deferred(object()), "object._defer_save_until_validation"),
    (lambda: api.defer_save(object()), "object._defer_save_until_validation"),
    (
        lambda: api.validates_after_step(SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=1))),
        "SimpleNamespace._data_fetcher",
    ),
]


@pytest.mark.parametrize(("call", "name"), MOVED, ids=[name for _, name in MOVED])
def test_a_moved_name_is_one_line_naming_release_and_name(call, name):
    with pytest.raises(api.LightningMoved, match=moved(name)):
        call()


def test_moved_summary_table_or_csv_hook_is_one_line(monkeypatch, tmp_path):
    monkeypatch.delattr(model_summary, "_format_summary_table")
    with pytest.raises(api.LightningMoved, match=moved(f"{model_summary.__name__}._format_summ")):
        api.summary_table()
    monkeypatch.delattr(_ExperimentWriter, "_check_log_dir_exists")
    with pytest.raises(api.LightningMoved, match=moved("ExperimentWriter._check_log_dir_exists")):
        api.appending_csv_experiment(CSVLogger(tmp_path))


def moved(name: str) -> str:
    return (
        rf"^Lightning {re.escape(L.__version__)} has no {re.escape(name)}\w*, which "
        r"bert_lightning/training/lightning_api\.py reads: update it for this release$"
    )


def test_issue_55s_grep_finds_nothing_outside_the_door():
    """The acceptance grep of issue #55; tests/test_private_api.py scans for every private name
    of Lightning's outside the doors."""
    grep = re.compile(r"trainer\._|\._[a-z_]*connector|lightning.*\._")
    hits = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != DOOR
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if grep.search(line)
    ]
    assert not hits, hits
