"""The one optimizer of pretraining and fine-tuning: AdamW over BERT's two parameter groups, a
linear warmup, then a linear decay to 0 at `total_steps` or, on a time budget
(`trainer.max_time`), as that time runs out: with both, whichever ends first (the lower rate);
and the gradient clipping that goes with it under every precision.

`conf/optim/adamw.yaml` names `adamw` with `_partial_: true`; a LightningModule keeps that
config as a plain dict (checkpoints stay loadable with `weights_only=True`) and builds it in
`configure_optimizers`."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.plugins.precision import MixedPrecision

from bert_lightning.errors import UserError
from bert_lightning.private_api import set_last_lr
from bert_lightning.training.instantiate import instantiate
from bert_lightning.training.lightning_api import budget_seconds

FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu")  # where torch has a fused AdamW kernel


def param_groups(
    model: torch.nn.Module,
    weight_decay: float,
    lr: float,
    head_lr: float | None,
    layer_decay: float,
) -> list[dict]:
    """BERT's rule: decay matrices (linear and embedding weights), not biases or LayerNorm.
    `head_lr`: the rate of the parameters outside the encoder (`model.bert`): a new head fits
    its data fast while the encoder moves at `lr`, so the encoder's features are not bent to
    make up for an unfit head (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features").
    `layer_decay` (ELECTRA's layer-wise rate decay): of L layers, layer i learns at
    `lr * layer_decay ** (L - i)` and the embeddings at `lr * layer_decay ** (L + 1)`, so the
    lower layers, whose features are the most general, move least; the rest at `lr`."""
    head = set()
    if head_lr is not None:
        head = {id(p) for p in model.parameters()} - {id(p) for p in model.bert.parameters()}
    depth, names = {}, {0: ""}  # id(parameter) -> the power of the decay; power -> name part
    if layer_decay != 1.0:
        depth, L = encoder_depths(model.bert), model.bert.config.num_hidden_layers
        names |= {L - i: f"_layer{i}" for i in range(L)} | {L + 1: "_embeddings"}
    groups = []
    for rate, in_head in ((lr, False), (head_lr, True)):
        params = [p for p in model.parameters() if p.requires_grad and (id(p) in head) == in_head]
        # the names of metrics.csv's columns (lr/model, lr/encoder_no_decay, lr/head, ...)
        part = "head" if in_head else "model" if head_lr is None else "encoder"
        for k in sorted({depth.get(id(p), 0) for p in params}):
            at_k = [p for p in params if depth.get(id(p), 0) == k]
            for decay in (True, False):
                chosen = [p for p in at_k if (p.ndim >= 2) == decay]
                if chosen:
                    wd = weight_decay if decay else 0.0
                    name = part + names[k] + ("" if decay else "_no_decay")
                    groups.append(
                        {
                            "params": chosen,
                            "weight_decay": wd,
                            "lr": rate * layer_decay**k,
                            "name": name,
                        }
                    )
    return groups


def encoder_depths(bert: torch.nn.Module) -> dict[int, int]:
    """{id(parameter): its distance below the top} for the embeddings (L + 1) and each layer i
    (L - i) of an encoder of L layers; what is above them (the pooler) is not in it (0)."""
    L = bert.config.num_hidden_layers
    out = {}
    for name, p in bert.named_parameters():
        layer = re.match(r"encoder\.layer\.(\d+)\.", name)
        if layer:
            out[id(p)] = L - int(layer[1])
        elif name.startswith("embeddings."):
            out[id(p)] = L + 1
    return out


def warmup_linear_decay(warmup_steps: int, total_steps: int):
    """LambdaLR factor: linear warmup from 0 to 1, then linear decay to 0 at `total_steps`
    (and 0 after it)."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))

    return factor


def budget_linear_decay(
    progress: Callable[[], float], warmup_steps: int | None, warmup_ratio: float | None
):
    """LambdaLR factor on a time budget (Cramming's budget schedule: the decay ends when the
    time does, whatever the step rate). `progress()`: the share of the budget spent, 0..1.
    Warmup over `warmup_steps` steps or the first `warmup_ratio` of the budget, then linear
    decay to 0 at the budget's end."""
    if warmup_steps is not None and warmup_ratio is not None:
        warmup_length(0, warmup_steps, warmup_ratio)  # the one error for both set
    decay_share = max(1e-9, 1.0 - (warmup_ratio or 0.0))  # of the budget

    def factor(step: int) -> float:
        p = min(1.0, progress())
        if warmup_steps:
            warm = (step + 1) / warmup_steps
        else:
            warm = p / warmup_ratio if warmup_ratio else 1.0
        return max(0.0, min(1.0, warm, (1.0 - p) / decay_share))

    return factor


def warmup_length(total_steps: int, warmup_steps: int | None, warmup_ratio: float | None) -> int:
    """One warmup schema for pretraining and fine-tuning: a step count or a fraction of the
    schedule, never both."""
    if warmup_steps is not None and warmup_ratio is not None:
        raise UserError(
            f"optim.warmup_steps={warmup_steps} and optim.warmup_ratio={warmup_ratio}: "
            "set one of them (the other to null)"
        )
    if warmup_ratio is not None:
        return round(warmup_ratio * total_steps)
    return warmup_steps or 0


def adamw(
    model: torch.nn.Module,
    run_steps: int,
    *,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float],
    eps: float,
    warmup_steps: int | None,
    warmup_ratio: float | None,
    total_steps: int | None,
    head_lr: float | None,
    layer_decay: float,
    fused: bool = True,
    progress: Callable[[], float] | None = None,
) -> dict:
    """What `configure_optimizers` returns. `run_steps`: the optimizer steps of this fit (0: not
    bounded); `total_steps` (default `run_steps`) is where the decay reaches 0, a value of its own
    so that a run continued past its end keeps a schedule one can predict. `progress`: the share
    of a time budget spent; given, the schedule follows it too, and a run bounded by both steps
    and time trains at the lower of the two rates: its rate reaches 0 at whichever end comes
    first. `fused`: one kernel for all parameters where the device has it (else the
    multi-tensor implementation)."""
    device = next(model.parameters()).device.type
    fused = fused and device in FUSED_DEVICES
    opt = torch.optim.AdamW(
        param_groups(model, weight_decay, lr, head_lr, layer_decay),
        lr=lr,
        betas=tuple(betas),
        eps=eps,
        fused=fused or None,
        foreach=None if fused else True,
    )
    schedules = []
    if progress is not None:
        schedules.append(budget_linear_decay(progress, warmup_steps, warmup_ratio))
    if progress is None or run_steps:  # steps bound the run
        total = total_steps or run_steps
        schedules.append(
            warmup_linear_decay(warmup_length(total, warmup_steps, warmup_ratio), total)
        )
    factor = schedules[0] if len(schedules) == 1 else lambda step: min(f(step) for f in schedules)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    schedule = {"scheduler": sched, "interval": "step", "name": "lr"}  # metrics' lr/<group>
    return {"optimizer": opt, "lr_scheduler": schedule}


def configure_optimizers(module) -> dict:
    """A LightningModule's `configure_optimizers`: builds `module.hparams.optim` (the
    `conf/optim` partial) over `module.trained()`. The AdamW is fused unless a gradient scaler
    exists (`16-mixed`): see `clip_gradients`."""
    trainer = module.trainer
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    progress = budget_progress(trainer)
    steps = trainer.estimated_stepping_batches  # inf: bounded by time alone, or by nothing
    run_steps = 0 if math.isinf(steps) else int(steps)
    if (run_steps or progress is None) and module.hparams.optim.get("total_steps") is None:
        # recorded in every checkpoint: a continued run keeps this schedule (resume.py)
        module.hparams.optim = {**module.hparams.optim, "total_steps": run_steps}
    build = instantiate(module.hparams.optim, "optim")
    built = build(module.trained(), run_steps=run_steps, fused=scaler is None, progress=progress)
    # this config's group settings: a resumed run restores the first run's (follow_schedule)
    groups = built["optimizer"].param_groups
    module.built_groups = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    return built


def budget_timer(trainer) -> Timer | None:
    """The Timer of a run with a time budget (`trainer.max_time`): Lightning's own, whose clock
    a checkpoint saves, so a resumed run spends what is left."""
    timer = next((c for c in trainer.callbacks if isinstance(c, Timer)), None)
    return timer if timer is not None and timer.time_remaining() is not None else None


def budget_progress(trainer) -> Callable[[], float] | None:
    """The share of the run's time budget spent, the same on every rank (rank 0's clock;
    the scheduler steps at the same point on all of them); None: a run without one."""
    timer = budget_timer(trainer)
    if timer is None:
        return None
    # the duration read at each step: a ValidationBudget shortens it (training/budget.py)
    return lambda: trainer.strategy.broadcast(timer.time_elapsed() / budget_seconds(timer))


def follow_schedule(trainer) -> None:
    """At the start of a fit: the optimizer's settings (rates, betas, decay) as this run's
    config built them, each rate as its schedule gives it for the current step. A resumed run
    restores the optimizer's and the schedule's saved settings, the first run's: without this
    its steps would use them whatever the resume's config (`resume.continued_optim`: the
    checkpoint's values unless the command line gives others) or `optim.total_steps` say."""
    built = trainer.lightning_module.built_groups
    for config in trainer.lr_scheduler_configs:
        sched = config.scheduler
        if isinstance(sched, torch.optim.lr_scheduler.LambdaLR):
            groups = sched.optimizer.param_groups
            for group, settings in zip(groups, built, strict=True):
                group.update(settings)
            sched.base_lrs = [group["initial_lr"] for group in groups]
            for group, base, factor in zip(groups, sched.base_lrs, sched.lr_lambdas, strict=True):
                group["lr"] = base * factor(sched.last_epoch)
            set_last_lr(sched, [group["lr"] for group in groups])


def clip_gradients(module, optimizer, clip_val, algorithm) -> None:
    """A LightningModule's `configure_gradient_clipping`.

    Lightning's `MixedPrecision.clip_gradients` refuses any optimizer that unscales its own
    gradients (a fused AdamW), whatever the dtype. That is only wrong with a gradient scaler
    (`16-mixed`: the gradients are scaled); then `configure_optimizers` made a non-fused AdamW,
    Lightning unscales before this hook and clips as usual. Without a scaler (`bf16-mixed`) the
    gradients are the true ones: clip them with the plugin's own functions and keep the fused
    step. Other plugins (32-true, bf16-true, DeepSpeed, which clips inside its engine) take
    Lightning's path unchanged."""
    if not clip_val:
        return
    plugin = module.trainer.precision_plugin
    if isinstance(plugin, MixedPrecision) and plugin.scaler is None:
        if algorithm == "value":
            plugin.clip_grad_by_value(optimizer, clip_val)
        else:
            plugin.clip_grad_by_norm(optimizer, clip_val)
    else:
        module.clip_gradients(optimizer, clip_val, algorithm)
