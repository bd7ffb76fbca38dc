"""Callbacks the tests add to runs (`+callbacks.NAME._target_=probe.CLASS`, with tests/ on
PYTHONPATH): `LossProbe` and `GradProbe` make every rank write its own values (Lightning's CSV
log holds rank 0's only); `CrashAt` and `SignalRank` stop a run as a fault would."""

import json
import os
import signal
from pathlib import Path

import lightning as L


class LossProbe(L.Callback):
    def __init__(self):
        self.losses: dict[int, float] = {}
        self.sharded: list[str] = []

    def on_train_start(self, trainer, pl_module):
        from torch.distributed.fsdp import FSDPModule

        self.sharded = [n for n, m in pl_module.named_modules() if isinstance(m, FSDPModule)]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses[trainer.global_step - 1] = float(outputs["loss"])

    def on_train_end(self, trainer, pl_module):
        out = Path(trainer.default_root_dir) / f"probe-rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"losses": self.losses, "sharded": self.sharded}))


def read_probes(run_dir: Path) -> list[dict]:
    """One dict per rank, rank order; loss keys back to ints."""
    probes = []
    for path in sorted(run_dir.glob("probe-rank*.json")):
        p = json.loads(path.read_text())
        p["losses"] = {int(k): v for k, v in p["losses"].items()}
        probes.append(p)
    return probes


class GradProbe(L.Callback):
    """Writes, per rank, each step's loss and gradient norm before and after clipping: the run
    matrix's proof that a step was taken and clipped (Lightning clips after
    `on_before_optimizer_step` and zeroes the gradients only at the next step)."""

    def __init__(self):
        self.steps: list[dict] = []

    @staticmethod
    def grad_norm(pl_module) -> float:
        import torch

        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.steps.append({"before_clip": self.grad_norm(pl_module)})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.steps[-1].update(after_clip=self.grad_norm(pl_module), loss=float(outputs["loss"]))

    def on_train_end(self, trainer, pl_module):
        out = Path(trainer.default_root_dir) / f"grads-rank{trainer.global_rank}.json"
        out.write_text(json.dumps({"steps": self.steps, "global_step": trainer.global_step}))


class CrashAt(L.Callback):
    """Raises before the batch of optimizer step `step` + 1, as a killed process stops."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError("simulated crash")


class SignalRank(L.Callback):
    """Sends `sig` when rank `rank` starts optimizer step `step` + 1: to this process, or with
    `group` to every process of the run (both ranks and their loader workers), as SLURM does."""

    def __init__(self, step: int, rank: int, sig: str, group: bool = False):
        self.step, self.rank, self.sig, self.group = step, rank, sig, group

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step and trainer.global_rank == self.rank:
            sig = getattr(signal, self.sig)
            os.killpg(os.getpgid(0), sig) if self.group else os.kill(os.getpid(), sig)


class SignalAtValidation(L.Callback):
    """Sends `sig` to every process of the run as the first validation of the fit after step 0
    starts (the one at step `val_check_interval`)."""

    def __init__(self, sig: str):
        self.sig, self.sent = sig, False

    def on_validation_start(self, trainer, pl_module):
        if trainer.state.fn == "fit" and trainer.global_step > 0 and not self.sent:
            self.sent = True
            os.killpg(os.getpgid(0), getattr(signal, self.sig))


class FirstBatch(L.Callback):
    """Saves the first training batch (`first_batch.pt` in the run folder): the masked batch a
    test recomputes a loss on."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        import torch

        if trainer.global_step == 0:
            torch.save(batch, Path(trainer.default_root_dir) / "first_batch.pt")


class SignalMidValidation(L.Callback):
    """Sends `sig` as batch `batch` of the fit's first validation at step `step` or later
    starts, to this process or (`group`) to every process of the run, and writes when into
    `signalled` in the run folder."""

    def __init__(self, batch: int, sig: str = "SIGTERM", group: bool = False, step: int = 1):
        self.batch, self.sig, self.group, self.step, self.sent = batch, sig, group, step, False

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        import time

        if trainer.state.fn != "fit" or trainer.global_step < self.step or self.sent:
            return
        if batch_idx == self.batch:
            self.sent = True
            (Path(trainer.default_root_dir) / "signalled").write_text(str(time.time()))
            sig = getattr(signal, self.sig)
            os.killpg(os.getpgid(0), sig) if self.group else os.kill(os.getpid(), sig)


class SignalAtTest(L.Callback):
    """Sends this process SIGTERM as the second batch of a test starts."""

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        if batch_idx == 1:
            os.kill(os.getpid(), signal.SIGTERM)


class RunOutOfTimeAt(L.Callback):
    """As if `trainer.max_time` ran out during optimizer step `step`: as that step's batch
    starts, the Timer's clock moves past its duration (every hook of the step sees it)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        from lightning.pytorch.callbacks import Timer

        if trainer.global_step == self.step - 1:
            timer = next(c for c in trainer.callbacks if isinstance(c, Timer))
            timer._offset += timer._duration


class LastAtValidation(L.Callback):
    """Appends, as each validation of the fit starts, its step and the step `last.ckpt` holds
    then (None: none yet) to `last_at_validation.jsonl` in the run folder."""

    def on_validation_start(self, trainer, pl_module):
        import torch

        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return
        run = Path(trainer.default_root_dir)
        last = run / "checkpoints" / "last.ckpt"
        saved = torch.load(last, weights_only=True)["global_step"] if last.exists() else None
        with open(run / "last_at_validation.jsonl", "a") as f:
            f.write(json.dumps([trainer.global_step, saved]) + "\n")
