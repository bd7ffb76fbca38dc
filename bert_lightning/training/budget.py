"""`ValidationBudget`: a run with a time budget (`trainer.max_time`) validates inside it, and for
at most a share of it. Every validation scores the whole validation set, so that the figures of
two runs (a sweep's jobs, on machines of any speed) compare: what the clock decides is when the
training stops and how many of the fit's validations are made, never what one of them scores."""

from __future__ import annotations

import logging
import time

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn

from bert_lightning.errors import UserError
from bert_lightning.training.interrupt import fit_ends_after
from bert_lightning.training.lightning_api import (
    budget_seconds,
    set_budget_seconds,
    skip_this_validation,
)
from bert_lightning.training.optim import budget_timer

log = logging.getLogger(__name__)

MARGIN = 1.0  # seconds: this close to the budget's end, the fit ends rather than skip


class ValidationBudget(L.Callback):
    """The first validation (the one before the fit, or else the fit's first) is timed: `cost`.
    The budget keeps room for the validations outside Lightning's Timer, whose clock counts the
    fit alone: the one before the fit and the last, at the fit's final step (`reserved`
    seconds off the Timer's duration, which the rate's schedule follows, so the rate still
    ends at 0 with the training). A validation of the fit's cadence is skipped when it would
    leave too little of `share` of the budget for the last. Saved with the run: a resumed run
    ends and validates as the run it continues would have."""

    def __init__(self, share: float):
        self.share = share
        self.cost: float | None = None  # seconds of a whole validation, the first one's
        self.spent = 0.0  # seconds of validation so far, the one before the fit's included
        self.reserved = 0.0  # seconds of the budget kept from the Timer for validations
        self.budget: float | None = None  # trainer.max_time in seconds, once reserved from
        self.started = 0.0

    def state_dict(self) -> dict:
        return {"cost": self.cost, "spent": self.spent, "reserved": self.reserved}

    def load_state_dict(self, state_dict: dict) -> None:
        """An older run's state (a bound on its batches) restores nothing: whole validations."""
        self.cost = state_dict.get("cost")
        self.spent = state_dict.get("spent", 0.0)
        self.reserved = state_dict.get("reserved", 0.0)

    def on_fit_start(self, trainer, pl_module) -> None:
        """A resumed run's Timer (max_time again) keeps the room the first run reserved, before
        the Timer's own look at a fit already out of time (its hook comes after this one's).
        Resumed without a time limit, a run has no budget to keep."""
        timer = budget_timer(trainer)
        if self.budget is None and self.reserved and timer is not None:
            if self.reserved >= budget_seconds(timer):
                raise UserError(
                    f"the checkpoint's callbacks.ValidationBudget.reserved={self.reserved:.1f} "
                    f"s: expected less than trainer.max_time ({budget_seconds(timer):.0f} s)"
                )
            self.reserve(trainer, self.reserved)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.started = time.monotonic()

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or budget_timer(trainer) is None:
            return
        seconds = trainer.strategy.broadcast(time.monotonic() - self.started)  # rank 0's
        self.spent += seconds
        if self.cost is not None:
            return
        self.cost = seconds
        before_fit = trainer.state.fn == TrainerFn.VALIDATING
        outside = seconds * (2 if before_fit else 1)
        budget = self.budget or budget_seconds(budget_timer(trainer))
        self.reserve(trainer, min(outside, budget / 2))  # the training keeps half, at least
        room = self.share * budget - self.spent - seconds  # the last one's kept
        if seconds == 0 or not trainer.is_global_zero:
            return
        if room < 0:
            past = outside - budget / 2
            log.warning(
                "validation: %.1f s each; with the last one it takes %.1f%% of the %.0f s "
                "budget, over callbacks.validation_budget.share (%.0f%%): none other in the "
                "fit%s (data.max_eval_samples, data.val_docs or task.subsample.validation "
                "make it smaller)",
                *(seconds, 100 * (self.spent + seconds) / budget, budget, 100 * self.share),
                f"; the run ends {past:.0f} s past trainer.max_time" if past > 0 else "",
            )
        else:
            log.info(
                "validation: %.1f s each; the fit makes at most %d before its last, within "
                "%.0f%% of the %.0f s budget (callbacks.validation_budget.share)",
                *(seconds, int(room // seconds) + (not before_fit), 100 * self.share, budget),
            )

    def reserve(self, trainer, seconds: float) -> None:
        timer = budget_timer(trainer)
        if self.budget is None:  # trainer.max_time, before any reservation
            self.budget = budget_seconds(timer)
        self.reserved = seconds
        set_budget_seconds(timer, self.budget - seconds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Every decision from values all ranks share, or rank 0's clock."""
        if self.cost is None or self.budget is None:
            return
        if fit_ends_after(trainer):  # the last validation, the one the budget kept room for,
            trainer.should_stop = True  # at the final step whatever the cadence
            return
        if self.spent + 2 * self.cost <= self.share * self.budget:
            return
        left = trainer.strategy.broadcast(budget_timer(trainer).time_remaining())
        if left > MARGIN:
            skip_this_validation(trainer)
        else:  # the Timer may end the fit at this step or the next: its last validation now,
            # the budget spent as the Timer counts it (a resume from here trains nothing)
            self.reserve(trainer, self.reserved + max(left, 0.0))
            trainer.should_stop = True
