"""`ValidationBudget`: a run on a time budget (`trainer.max_time`, conf/schedule/time_budget.yaml)
spends at most a share of it validating, a distillation's teacher forward included: a
validation set sized for a run of steps can otherwise eat a third of a short budget."""

from __future__ import annotations

import logging
import math
import time

import lightning as L
from lightning.pytorch.trainer.states import TrainerFn

from bert_lightning.training.lightning_api import budget_seconds
from bert_lightning.training.optim import budget_timer

log = logging.getLogger(__name__)


class ValidationBudget(L.Callback):
    """Times the validation before the fit (`validate_before_fit`) and, if the `validations`
    the schedule plans in the fit would take more than what is left of `share` of the budget
    at that cost, validates each on its first N batches, as many as fit (`trainer.
    limit_val_batches`, read when the fit's validation loop sets up: every validation of the
    fit scores the same N batches; step 0's loss is of all of them). The bound is saved with
    the run: a resumed run keeps it. Without a validation before the fit there is nothing to
    measure, and nothing is bounded."""

    def __init__(self, share: float, validations: int):
        self.share = share
        self.validations = validations
        self.batches: int | None = None  # the bound, once one was needed
        self.started = self.batch_started = self.in_batches = 0.0  # this validation's clock

    def state_dict(self) -> dict:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict) -> None:
        self.batches = state_dict["batches"]

    def on_fit_start(self, trainer, pl_module) -> None:
        if self.batches is not None:  # a resumed run's
            trainer.limit_val_batches = self.batches

    def on_validation_start(self, trainer, pl_module) -> None:
        self.started, self.in_batches = time.monotonic(), 0.0

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.batch_started = time.monotonic()

    def on_validation_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0
    ) -> None:
        self.in_batches += time.monotonic() - self.batch_started

    def on_validation_end(self, trainer, pl_module) -> None:
        timer = budget_timer(trainer)
        if timer is None or trainer.state.fn != TrainerFn.VALIDATING:
            return
        seconds, in_batches = trainer.strategy.broadcast(
            (time.monotonic() - self.started, self.in_batches)
        )
        batches = sum(trainer.num_val_batches)
        budget = budget_seconds(timer)
        # what is left of the share, for each validation of the fit and a spare (the cost of
        # one varies, and the fit may end on one more); each costs what the first did outside
        # its batches (model modes, loaders, logging), and a batch what one of the first did
        each = (self.share * budget - seconds) / (self.validations + 1)
        fit = max(1, math.floor((each - (seconds - in_batches)) / (in_batches / batches)))
        if fit >= batches:
            return
        self.batches = trainer.limit_val_batches = fit
        log.info(
            "validation: the first %d of %d batches from here on (the first validation took "
            "%.1f s): %d more keep validation within %.0f%% of the %.0f s budget "
            "(callbacks.validation_budget)",
            *(fit, batches, seconds, self.validations, 100 * self.share, budget),
        )
