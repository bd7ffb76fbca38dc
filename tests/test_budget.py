"""A run on a time budget (`trainer.max_time`, `trainer.max_steps=-1`): the learning rate decays
with the time spent, reaches its end when the time does, and a resumed run keeps the clock.
A fake clock that moves one second per training batch makes the times exact."""

import csv
import time
from types import SimpleNamespace

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import timer as lightning_timer
from run_matrix import DISTILL

from bert_lightning.config import compose
from bert_lightning.errors import UserError
from bert_lightning.signals import Interrupted
from bert_lightning.training import budget
from bert_lightning.training.budget import ValidationBudget
from bert_lightning.training.optim import budget_linear_decay
from bert_lightning.training.pretrain import train
from helpers import tiny_overrides, write_corpus

CLOCK = SimpleNamespace(now=0.0)
LR = 1e-3


class Tick(L.Callback):
    """Each training batch takes exactly one second of the fake clock."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        CLOCK.now += 1.0


SEEN: list[dict] = []  # each validation of a run: its batches, step, start and end


class ValidationTick(L.Callback):
    """Each validation batch takes half a second of the fake clock (SEEN records them)."""

    def on_validation_start(self, trainer, pl_module):
        SEEN.append({"start": CLOCK.now, "batches": 0, "step": trainer.global_step})

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        CLOCK.now += 0.5
        SEEN[-1]["batches"] += 1

    def on_validation_end(self, trainer, pl_module):
        SEEN[-1]["end"] = CLOCK.now


@pytest.fixture
def fake_clock(monkeypatch):
    """Lightning's Timer and the validation budget on the fake clock."""
    CLOCK.now = 0.0
    clock = SimpleNamespace(monotonic=lambda: CLOCK.now)
    monkeypatch.setattr(lightning_timer, "time", clock)
    monkeypatch.setattr(budget, "time", clock)


def run(out_dir, *extra):
    write_corpus(out_dir / "corpus.jsonl", 60)
    overrides = tiny_overrides(
        out_dir,
        "trainer.max_steps=-1",
        "trainer.max_time=00:00:00:10",
        "trainer.val_check_interval=4",
        "callbacks.model_checkpoint.every_n_train_steps=4",
        f"optim.lr={LR}",
        "optim.warmup_steps=2",
        "+callbacks.tick._target_=test_budget.Tick",
        *extra,
    )
    train(compose(overrides=overrides))


def rates(out_dir) -> list[float]:
    with open(out_dir / "metrics.csv") as f:
        return [float(r["lr/model"]) for r in csv.DictReader(f) if r.get("lr/model")]


def test_the_rate_decays_with_the_time_spent_and_ends_with_the_budget(tmp_path, fake_clock):
    """10 s at 1 s a step: 10 steps; after the 2-step warmup step s trains at lr (1 - s/10),
    so the last step's rate is a tenth of the peak and the next would be 0."""
    run(tmp_path)
    lrs = rates(tmp_path)
    assert len(lrs) == 10
    assert lrs[:2] == pytest.approx([LR / 2, LR * 0.9])  # warmup (step 1 already at 1 - 1/10)
    assert lrs[2:] == pytest.approx([LR * (1 - s / 10) for s in range(2, 10)])
    last = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    assert last["global_step"] == 10


def test_a_resumed_run_spends_what_is_left_of_its_budget(tmp_path, fake_clock):
    """Killed at step 4 of 10, resumed: the checkpoint's clock says 4 s were spent, so the run
    takes 6 more steps at the rates of the run never killed, to the same weights."""
    run(tmp_path / "whole")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(
            tmp_path / "killed",
            "+callbacks.crash._target_=probe.CrashAt",
            "+callbacks.crash.step=4",
        )
    last = tmp_path / "killed/checkpoints/last.ckpt"
    run(tmp_path / "resumed", f"ckpt_path={last}")
    assert rates(tmp_path / "resumed") == rates(tmp_path / "whole")[4:]
    whole = torch.load(tmp_path / "whole/checkpoints/last.ckpt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed/checkpoints/last.ckpt", weights_only=True)
    assert resumed["global_step"] == whole["global_step"] == 10
    for name, tensor in whole["state_dict"].items():
        assert torch.equal(tensor, resumed["state_dict"][name]), name


def test_warmup_as_a_share_of_the_budget():
    spent = SimpleNamespace(p=0.0)
    factor = budget_linear_decay(lambda: spent.p, None, 0.2)
    got = []
    for p in (0.0, 0.1, 0.2, 0.6, 1.0, 1.5):
        spent.p = p
        got.append(factor(0))
    assert got == pytest.approx([0.0, 0.5, 1.0, 0.5, 0.0, 0.0])


@pytest.mark.parametrize("max_steps", [20, 6])
def test_steps_and_a_time_limit_train_at_the_lower_of_their_rates(tmp_path, fake_clock, max_steps):
    """A step schedule and 10 s at 1 s a step: the rate is the lower of the two schedules', so
    it reaches 0 at whichever end comes first: the clock's (20 steps: the run stops at step 10
    with the rate at a tenth of the peak, not the step schedule's half) or the steps' (6)."""
    run(tmp_path, f"trainer.max_steps={max_steps}")

    def lr(s: int) -> float:
        warm = (s + 1) / 2
        by_steps = warm if s < 2 else (max_steps - s) / (max_steps - 2)
        return LR * min(warm, 1 - s / 10, by_steps)

    steps = min(max_steps, 10)
    assert rates(tmp_path) == pytest.approx([lr(s) for s in range(steps)])
    assert torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)["global_step"] == steps


def test_share_of_time_is_an_nth_of_the_budget():
    """`${share_of_time:${trainer.max_time},N,STEPS}` (the budgeted experiments' validation
    cadence): an Nth of the budget, a time-based interval Lightning validates at; STEPS
    without a budget."""
    from bert_lightning.config import share_of_time

    assert share_of_time("00:00:30:00", 10, 1000) == "00:00:03:00"
    assert share_of_time("01:02:00:00", 10, 1000) == "00:02:36:00"
    assert share_of_time(None, 10, 1000) == 1000


@pytest.mark.slow
def test_a_budget_shared_by_time_validates_n_times(tmp_path):
    """A 4-second run validating each third of its budget: three validations or more."""
    write_corpus(tmp_path / "corpus.jsonl", 60)
    every = "trainer.val_check_interval='${share_of_time:${trainer.max_time},3,1000}'"
    budget = ["trainer.max_steps=-1", "trainer.max_time=00:00:00:04", every]
    train(compose(overrides=tiny_overrides(tmp_path, *budget, "validate_before_fit=false")))
    with open(tmp_path / "metrics.csv") as f:
        validations = [r for r in csv.DictReader(f) if r.get("val/loss")]
    assert len(validations) >= 3  # after each 1.3 s, and the budget's last step


VALIDATIONS: list[float] = []  # the seconds of each validation of a run


class ValidationTimes(L.Callback):
    """The wall time of each validation, the one before the fit included."""

    def on_validation_start(self, trainer, pl_module):
        VALIDATIONS.append(-time.monotonic())

    def on_validation_end(self, trainer, pl_module):
        VALIDATIONS[-1] += time.monotonic()


@pytest.mark.slow
def test_a_budgeted_distillation_validates_within_a_tenth_of_its_budget(tmp_path):
    """A 30-second distillation from all-MiniLM-L6-v2 on 80 held-out examples: a validation
    costs ~0.6 s idle (the teacher's forward with the student's), so validating each fifth of
    the budget and at its end spent a fifth of it. The first one, before the fit, is timed, and
    each of the fit's others begins only where it leaves room in the tenth for the last; the
    callback's record (the checkpoint) counts what the validations took."""
    VALIDATIONS.clear()
    write_corpus(tmp_path / "corpus.jsonl", 200)
    seconds = 30
    overrides = tiny_overrides(
        tmp_path,
        *DISTILL,
        "schedule=time_budget",
        f"trainer.max_time=00:00:00:{seconds}",
        "trainer.max_steps=-1",  # debug=tiny's, after the schedule's: the schedule's again
        "trainer.val_check_interval='${share_of_time:${trainer.max_time},5,1000}'",
        "data.val_docs=20",
        "data.max_eval_samples=80",
        "+callbacks.times._target_=test_budget.ValidationTimes",
    )
    train(compose(overrides=overrides))
    state = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)["callbacks"]
    state = state["ValidationBudget"]
    assert state["spent"] == pytest.approx(sum(VALIDATIONS), rel=0.05)
    assert state["cost"] == pytest.approx(VALIDATIONS[0], rel=0.05)
    assert len(VALIDATIONS) >= 2  # the one before the fit, the last
    for i in range(1, len(VALIDATIONS) - 1):  # the fit's others: room for them and the last
        assert sum(VALIDATIONS[:i]) + 2 * state["cost"] <= 0.1 * seconds * 1.05, VALIDATIONS


def limited(out_dir, *extra) -> list[str]:
    """A run of steps with a 20-second limit, validating every 2 steps, each validation 1 s (2
    batches at 0.5 s of the fake clock), its validations within a quarter of the budget."""
    write_corpus(out_dir / "corpus.jsonl", 60)
    return tiny_overrides(
        out_dir,
        "trainer.max_steps=1000",
        "trainer.max_time=00:00:00:20",
        "trainer.val_check_interval=2",
        "data.max_eval_samples=8",
        "data.batch_size=4",
        "callbacks.validation_budget.share=0.25",
        "+callbacks.tick._target_=test_budget.Tick",
        "+callbacks.vtick._target_=test_budget.ValidationTick",
        *extra,
    )


def test_a_time_limit_holds_its_validations_whole_and_inside_it(tmp_path, fake_clock):
    """The validation before the fit and the last count in the 20 s, the fit's others stop where
    a quarter of the budget is spent, and every one scores every batch. Without the budget:
    8 s of validation (8 of them) and the fit 20 s."""
    SEEN.clear()
    train(compose(overrides=limited(tmp_path)))
    seen = SEEN
    assert [v["batches"] for v in seen] == [2] * len(seen)
    assert seen[0]["step"] == 0  # the one before the fit
    last = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)
    assert seen[-1]["step"] == last["global_step"]  # the last, at the final step
    spent = sum(v["end"] - v["start"] for v in seen)
    assert spent == 0.25 * 20  # 5 s of 1-second validations: the first, 3 in the fit, the last
    assert 20 - 2 <= seen[-1]["end"] <= 20  # the fit ends in the last second of its budget


@pytest.mark.parametrize("share", [0.25, 1.0])  # ended a second early by the share; the Timer
def test_a_finished_budgeted_run_resumed_trains_and_validates_nothing(tmp_path, fake_clock, share):
    """Its last.ckpt holds a budget spent: the Timer's clock against max_time less what the run
    kept for its validations (before, it trained one more step and validated it)."""
    SEEN.clear()
    shared = f"callbacks.validation_budget.share={share}"
    train(compose(overrides=limited(tmp_path / "whole", shared)))
    clock, seen = CLOCK.now, len(SEEN)
    last = tmp_path / "whole/checkpoints/last.ckpt"
    train(compose(overrides=[*limited(tmp_path / "again", shared), f"ckpt_path={last}"]))
    assert (CLOCK.now, len(SEEN)) == (clock, seen)


@pytest.mark.parametrize("step", [6, 13])  # mid-fit; at the fit's last step
def test_a_budgeted_run_stopped_and_resumed_is_the_run_never_stopped(tmp_path, fake_clock, step):
    """SIGTERM at a step, then a resume: the same validations at the same steps, the same
    final step and weights."""
    SEEN.clear()
    train(compose(overrides=limited(tmp_path / "whole")))
    whole = [v["step"] for v in SEEN]
    SEEN.clear()
    CLOCK.now = 0.0
    stop = ["+callbacks.stop._target_=probe.SignalRank", f"+callbacks.stop.step={step}"]
    stop += ["+callbacks.stop.rank=0", "+callbacks.stop.sig=SIGTERM"]
    with pytest.raises(Interrupted):
        train(compose(overrides=limited(tmp_path / "stopped", *stop)))
    last = tmp_path / "stopped/checkpoints/last.ckpt"
    train(compose(overrides=[*limited(tmp_path / "resumed"), f"ckpt_path={last}"]))
    assert [v["step"] for v in SEEN if "end" in v] == whole
    final = tmp_path / "resumed/checkpoints/last.ckpt"
    final = final if final.exists() else last  # nothing was left to train
    got = torch.load(final, weights_only=True)
    want = torch.load(tmp_path / "whole/checkpoints/last.ckpt", weights_only=True)
    assert got["global_step"] == want["global_step"]
    for name, tensor in want["state_dict"].items():
        assert torch.equal(tensor, got["state_dict"][name]), name


def test_a_budgeted_run_resumed_without_a_time_limit_goes_on_by_steps(tmp_path, fake_clock):
    """`trainer.max_time=null` on resume: no budget to keep, the steps bound the run."""
    train(compose(overrides=limited(tmp_path / "whole", "trainer.max_steps=-1")))
    last = tmp_path / "whole/checkpoints/last.ckpt"
    more = limited(tmp_path / "more", "trainer.max_time=null", "trainer.max_steps=18")
    train(compose(overrides=[*more, f"ckpt_path={last}"]))
    got = torch.load(tmp_path / "more/checkpoints/last.ckpt", weights_only=True)
    assert got["global_step"] == 18


@pytest.mark.parametrize("before_fit", ["true", "false"])
def test_the_budgets_line_counts_the_fits_validations(tmp_path, fake_clock, caplog, before_fit):
    """40 s, a quarter of it for validation: the line's N is the fit's validations before its
    last, with a validation before the fit or without one (the fit's first then is timed)."""
    SEEN.clear()
    extra = ["trainer.max_time=00:00:00:40", f"validate_before_fit={before_fit}"]
    with caplog.at_level("INFO", logger=budget.__name__):
        train(compose(overrides=limited(tmp_path, *extra)))
    (line,) = [r.getMessage() for r in caplog.records if r.name == budget.__name__]
    in_fit = [v for v in SEEN if v["step"] > 0][:-1]
    assert f"the fit makes at most {len(in_fit)} before its last" in line


def test_steps_ending_off_the_cadence_still_end_on_a_validation(tmp_path, fake_clock):
    """13 steps, a validation every 2, the share spent after the one at step 2: the last
    validation, kept room for, comes at step 13 (before, none came after step 2)."""
    SEEN.clear()
    extra = ["trainer.max_steps=13", "callbacks.validation_budget.share=0.15"]
    train(compose(overrides=limited(tmp_path, *extra)))
    assert [v["step"] for v in SEEN] == [0, 2, 13]


def test_validation_over_its_share_is_said_and_the_training_keeps_half(
    tmp_path, fake_clock, caplog
):
    """Validations of 4 s (8 batches) in 10 s: the one before the fit and the last alone take
    80%, over the share; the fit validates no other, trains for half the budget, and one
    warning says where the run ends and what makes validation smaller."""
    SEEN.clear()
    overrides = limited(tmp_path, "trainer.max_time=00:00:00:10", "data.max_eval_samples=32")
    with caplog.at_level("INFO", logger=budget.__name__):
        train(compose(overrides=overrides))
    lines = [r.getMessage() for r in caplog.records if r.name == budget.__name__]
    assert [v["step"] for v in SEEN] == [0, 4]  # 5 s to train, ended in its last second
    assert SEEN[-1]["end"] == 4 + 4 + 4
    assert lines == [
        "validation: 4.0 s each; with the last one it takes 80.0% of the 10 s budget, over "
        "callbacks.validation_budget.share (25%): none other in the fit; the run ends 3 s past "
        "trainer.max_time (data.max_eval_samples, data.val_docs or task.subsample.validation "
        "make it smaller)"
    ]


def test_a_crafted_reservation_of_the_whole_budget_is_one_line():
    """A checkpoint's `reserved` at or over max_time would leave a resumed run no time,
    silently: refused, naming the key."""
    resumed = ValidationBudget(0.1)
    resumed.load_state_dict({"cost": 1.0, "spent": 1.0, "reserved": 1e9})
    trainer = SimpleNamespace(callbacks=[lightning_timer.Timer(duration="00:00:01:00")])
    with pytest.raises(UserError) as e:
        resumed.on_fit_start(trainer, None)
    assert str(e.value) == (
        "the checkpoint's callbacks.ValidationBudget.reserved=1000000000.0 s: expected less "
        "than trainer.max_time (60 s)"
    )


def test_a_resumed_run_keeps_the_end_and_the_share_of_the_run_it_continues():
    """The budget's state is in the checkpoint: a resumed run, which validates nothing before
    its fit, stops where the run it continues would, and counts what it spent validating."""
    first, resumed = ValidationBudget(0.1), ValidationBudget(0.1)
    first.cost, first.spent, first.reserved = 2.0, 5.0, 4.0
    resumed.load_state_dict(first.state_dict())
    timer = lightning_timer.Timer(duration="00:00:01:00")
    trainer = SimpleNamespace(callbacks=[timer])
    resumed.on_fit_start(trainer, None)
    assert timer.time_remaining() == 56
    assert (resumed.cost, resumed.spent, resumed.budget) == (2.0, 5.0, 60)
