"""What the pretraining and fine-tuning LightningModules share: sharding and compiling the
encoder, the optimizer and its clipping (`optim.py`), and the tokenizer that travels inside
every checkpoint, so that a checkpoint is self-contained."""

from __future__ import annotations

import lightning as L
import torch
from torchmetrics import Metric

from bert_lightning.checkpoint import DATA_RECORD
from bert_lightning.errors import UserError
from bert_lightning.training import optim
from bert_lightning.training.lightning_api import batches_stepped, logs_this_step


class ValidationLoss(Metric):
    """A validation loss, `weights[k] x term k` summed, each term averaged over the items it
    is a mean of (masked tokens, pairs, positions) across the whole set rather than over
    batches: the figure does not depend on how rows are batched, a batch without such an item
    adds nothing, and exp of an MLM loss is the perplexity of the same tokens. Logged as the
    metric object (`self.log(key, metric)`), summed over ranks."""

    full_state_update = False

    def __init__(self, **weights: float):
        super().__init__()
        self.terms, self.weights = list(weights), torch.tensor(list(weights.values()))
        self.add_state("sums", torch.zeros(len(weights)), dist_reduce_fx="sum")  # (terms,)
        self.add_state("items", torch.zeros(len(weights)), dist_reduce_fx="sum")  # (terms,)

    def update(self, term: str, value: torch.Tensor, items: int | torch.Tensor) -> None:
        """`items`: how many the batch's `value` is a mean of (a count on the device is not
        read); none adds nothing, the value of a term with no items being 0."""
        # new tensors, not in place: states reset under inference mode stay valid
        one = torch.nn.functional.one_hot(torch.tensor(self.terms.index(term)), len(self.terms))
        one = one.to(self.sums)  # (terms,)
        self.sums = self.sums + one * value.detach().float() * items
        self.items = self.items + one * items

    def compute(self) -> torch.Tensor:
        return (self.weights.to(self.sums) * self.sums / self.items).sum()


class Share(Metric):
    """The share of `hits` among the items that count (`valid`), over all the items updated:
    accuracies, and RTD's share of replaced tokens. The MLM head's (B x K) rows past a row's
    picks, the padding of the discriminator's (B, T), are left out by a mask and not a boolean
    selection, so that the counts add up on the device and nothing waits for a size.
    NaN when no item counted (nothing picked: `mlm_probability=0`)."""

    full_state_update = False

    def __init__(self):
        super().__init__()
        self.add_state("hits", torch.zeros(()), dist_reduce_fx="sum")
        self.add_state("items", torch.zeros(()), dist_reduce_fx="sum")

    def update(self, hits: torch.Tensor, valid: torch.Tensor) -> None:
        """`hits`, `valid`: bools of one shape."""
        self.hits = self.hits + (hits & valid).sum()
        self.items = self.items + valid.sum()

    def compute(self) -> torch.Tensor:
        return self.hits / self.items


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


def compile_mode(setting: bool | str, device: torch.device) -> str | None:
    """`model_compile`: false, true (torch.compile's default mode), auto (that on a GPU, none
    on a CPU, where compiling did not pay: docs/performance.md) or a torch.compile mode ->
    the mode to compile with, None for eager."""
    if setting == "auto":
        setting = device.type == "cuda"
    if setting is True:
        return "default"
    if setting is False or setting is None:
        return None
    if setting not in COMPILE_MODES:
        raise UserError(
            f"model_compile={setting!r}; expected true, false, auto or one of {COMPILE_MODES}"
        )
    return setting


class EncoderModule(L.LightningModule):
    """Subclasses set `self.model` (a model with `.bert`), `self.tokenizer_json` and keep the
    `conf/optim` config as `hparams.optim` (and `hparams.compile`, optional). `data_record`:
    what the run trains on (its data module's), which every checkpoint keeps for a resume to
    compare (training/resume.py `check_same_data`) and `evaluate` to frame files by; not a
    hyper-parameter."""

    def __init__(self, data_record: dict | None = None):
        super().__init__()
        self.data_record = data_record

    def configure_model(self) -> None:
        """Under FSDP2 (`trainer=fsdp`: Lightning's ModelParallelStrategy) shard each encoder
        layer as its own unit, then the rest (embeddings, heads) at the root; then
        `compile=true` compiles in place (state-dict keys unchanged). Lightning calls this
        before each of validate/fit: it acts once."""
        if getattr(self, "_model_configured", False):
            return
        self._model_configured = True
        if self.device_mesh is not None:
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in self.model.bert.encoder.layer:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
        device = self.trainer.strategy.root_device  # where it will run (it is not there yet)
        mode = compile_mode(self.hparams.get("compile", False), device)
        if mode is not None:  # padded batches then run padded (BertModel.attention_inputs)
            self.model.compile(mode=mode)

    def trained(self) -> torch.nn.Module:
        """What the optimizer trains: `.bert`, the encoder, and heads (the rest)."""
        return self.model

    def configure_optimizers(self):
        return optim.configure_optimizers(self)

    def on_train_start(self) -> None:
        optim.follow_schedule(self.trainer)

    # One step numbering everywhere (logs, checkpoint names, metrics.csv, wandb): a row carries
    # the optimizer steps done when it is written, so the loss of step k and the validation
    # after k steps are at k, and the validation before training at 0 (Lightning's own index
    # is one less). Logging `step` replaces Lightning's, and its `epoch` with it.
    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if logs_this_step(self.trainer):  # a row is written: not a hot path
            self._log_position(batches_stepped(self.trainer) + 1)

    def on_validation_epoch_end(self) -> None:
        self._log_position(self.global_step, sync_dist=True)

    def _log_position(self, step: int, **kwargs) -> None:
        self.log_dict({"step": float(step), "epoch": float(self.current_epoch)}, **kwargs)

    def configure_gradient_clipping(
        self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None
    ) -> None:
        optim.clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokenizer"] = self.tokenizer_json
        if self.data_record is not None:
            checkpoint[DATA_RECORD] = self.data_record

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizer_json = checkpoint.get("tokenizer", self.tokenizer_json)
