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
        if self.budget is None and self.reserved and budget_timer(trainer) is not None:
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
        self.reserve(trainer, seconds * (2 if before_fit else 1))
        room = self.share * self.budget - self.spent - seconds  # the last one's kept
        more = max(0, int(room // seconds)) if seconds > 0 else None
        if more is not None and room < 0:
            log.warning(
                "validation: %.1f s each; with the last one it takes %.0f%% of the %.0f s "
                "budget, over callbacks.validation_budget.share (%.0f%%): none other in the "
                "fit (data.max_eval_samples or data.val_docs make it smaller)",
                *(seconds, 100 * (self.spent + seconds) / self.budget, self.budget),
                100 * self.share,
            )
        elif more is not None:
            log.info(
                "validation: %.1f s each; the fit makes at most %d before its last, within "
                "%.0f%% of the %.0f s budget (callbacks.validation_budget.share)",
                *(seconds, more, 100 * self.share, self.budget),
            )

    def reserve(self, trainer, seconds: float) -> None:
        timer = budget_timer(trainer)
        if self.budget is None:  # trainer.max_time, before any reservation
            self.budget = budget_seconds(timer)
        self.reserved = seconds
        if seconds >= self.budget:
            raise UserError(
                f"trainer.max_time: {self.budget:.0f} s leave no time to train beside "
                f"validation ({seconds:.1f} s); give more time, or validate on fewer examples "
                "(data.max_eval_samples; fine-tuning: task.subsample.validation)"
            )
        set_budget_seconds(timer, self.budget - seconds)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Every decision from values all ranks share, or rank 0's clock."""
        if self.cost is None or self.budget is None or fit_ends_after(trainer):
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
