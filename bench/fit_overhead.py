"""What the training loop costs around the step: `train.py`'s Lightning fit vs the bare step.

    python bench/fit_overhead.py                    # bert_mini, 60 steps, checkpoint every 20
    python bench/fit_overhead.py model=bert_small trainer.precision=bf16-mixed   # any override

The fit is the real one of `train.py` (the C4 sample, its tokenizer, the StatefulDataLoader and
MLM collator, CSV logging every 10 steps, TokenThroughput, the progress bar, a checkpoint every
`--ckpt-every` steps, compiled as `model_compile` says); validation is left out. After each fit
step a probe callback runs one bare step (`bench/train_step.py`'s: a copy of the model, compiled
alike, its own AdamW, one fixed collated batch), so the two alternate under the same machine
noise; the fit interval is the time from the end of the probe's bare step to the end of the
next fit step, so it holds everything the loop does. On a GPU, CUDA's sync debug mode counts
the host-device synchronisations of every step that does not log (the target: none), and the
fit's MFU is its useful FLOPs (`flops_per_batch`) over the median fit step and the card's peak.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from steps import make_step, timed

from bert_lightning.config import compose
from bert_lightning.training.callbacks import device_peak_flops
from bert_lightning.training.module_base import compile_mode
from bert_lightning.training.pretrain import build


class AlternateBareStep(L.Callback):
    """After each fit step: the fit interval ends; one bare step is timed; the next begins."""

    def __init__(self, model, optim, batch: dict, dtype, warmup: int, syncs: SyncCount):
        self.model, self.optim, self.batch, self.dtype = model, optim, batch, dtype
        self.syncs = syncs
        self.warmup = warmup
        self.fit, self.bare = [], []
        self.t = None

    def on_train_start(self, trainer, pl_module):
        self.device = pl_module.device
        model = self.model.to(self.device).train()
        mode = compile_mode(pl_module.hparams.get("compile", False), self.device)
        if mode is not None:  # the bare step compiled as the fit's model is (padded batches padded)
            model = torch.compile(model, mode=mode)
        batch = {k: v.to(self.device) for k, v in self.batch.items()}
        self.step = make_step(model, self.optim(model, run_steps=1)["optimizer"], batch, self.dtype)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        with self.syncs.pause():
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            now = time.perf_counter()
            if self.t is not None and batch_idx >= self.warmup:
                self.fit.append(now - self.t)
            t = timed(self.step, self.device)
            if batch_idx >= self.warmup:
                self.bare.append(t)
            self.t = time.perf_counter()


class SyncCount(L.Callback):
    """Host-device synchronisations (CUDA's sync debug mode, one warning each) of each training
    step that does not log, from its start to the next one's (the loop's work around the step
    included), the probe's bare step left out (`pause`)."""

    def __init__(self):
        self.counts: list[int] = []
        self.caught = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.stop()
        logs = (trainer.global_step + 1) % trainer.log_every_n_steps == 0
        if pl_module.device.type == "cuda" and not logs:
            self.caught = warnings.catch_warnings(record=True)
            self.seen = self.caught.__enter__()
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")

    def stop(self) -> None:
        if self.caught is not None:
            torch.cuda.set_sync_debug_mode("default")
            self.caught.__exit__(None, None, None)
            self.counts.append(sum("synchroniz" in str(w.message) for w in self.seen))
            self.caught = None

    @contextmanager
    def pause(self):
        if self.caught is None:
            yield
            return
        torch.cuda.set_sync_debug_mode("default")
        mark = len(self.seen)
        yield
        del self.seen[mark:]
        torch.cuda.set_sync_debug_mode("warn")

    def on_train_end(self, trainer, pl_module):
        self.stop()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--ckpt-every", type=int, default=20)
    p.add_argument("--json", help="also write the figures to this JSON file")
    p.add_argument("overrides", nargs="*", help="train.py overrides (default model=bert_mini)")
    args = p.parse_args()
    out = Path(tempfile.mkdtemp(prefix="fit_overhead_"))
    cfg = compose(
        "train",
        [
            "model=bert_mini",
            f"paths.output_dir={out}",
            f"trainer.max_steps={args.steps}",
            f"trainer.val_check_interval={args.steps + 1}",  # no validation inside the fit
            f"+callbacks.model_checkpoint.every_n_train_steps={args.ckpt_every}",
            "callbacks.model_checkpoint.monitor=null",
            *args.overrides,
        ],
    )
    L.seed_everything(cfg.seed)
    dm, module, trainer = build(cfg)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    precision = str(cfg.trainer.precision)
    dtype = torch.bfloat16 if precision.startswith("bf16") else None
    optim = instantiate(cfg.optim)  # the run's own AdamW, built for the bare step
    syncs = SyncCount()
    probe = AlternateBareStep(copy.deepcopy(module.model), optim, batch, dtype, args.warmup, syncs)
    trainer.callbacks += [syncs, probe]
    trainer.fit(module, datamodule=dm)
    tokens = batch["input_ids"].numel()  # packed blocks: no padding
    fit_mean, bare_mean = statistics.mean(probe.fit), statistics.mean(probe.bare)
    fit_med, bare_med = statistics.median(probe.fit), statistics.median(probe.bare)
    print(
        f"\n{cfg.model.hidden_size}-wide {cfg.model.num_hidden_layers}-layer model, "
        f"{precision}, {len(probe.fit)} fit steps alternating with {len(probe.bare)} bare steps "
        f"(checkpoint every {args.ckpt_every}), run folder {out}\n"
        f"tokens/s (mean over steps): fit {tokens / fit_mean:.0f}, bare step "
        f"{tokens / bare_mean:.0f} -> the loop costs {fit_mean / bare_mean - 1:+.1%}\n"
        f"tokens/s (median step):     fit {tokens / fit_med:.0f}, bare step "
        f"{tokens / bare_med:.0f} -> {fit_med / bare_med - 1:+.1%}"
    )
    device = module.device
    peak = device_peak_flops(device, precision)
    flops = float(module.flops_per_batch({k: v.to(device) for k, v in batch.items()}))
    if syncs.counts:
        print(f"host syncs per non-logging step: {statistics.mean(syncs.counts):.2f} (mean)")
    if args.json:
        figures = {
            "mean_overhead": fit_mean / bare_mean - 1,
            "median_overhead": fit_med / bare_med - 1,
            "fit_tok_s": tokens / fit_med,
            "bare_tok_s": tokens / bare_med,
            "fit_mfu": flops / fit_med / peak if peak else None,
            "bare_mfu": flops / bare_med / peak if peak else None,
            "compiled": compile_mode(module.hparams.get("compile", False), device),
            "syncs_per_step": statistics.mean(syncs.counts) if syncs.counts else None,
            "steps_with_syncs": sum(c > 0 for c in syncs.counts) if syncs.counts else None,
        }
        Path(args.json).write_text(json.dumps({**figures, "overrides": args.overrides}))


if __name__ == "__main__":
    main()
