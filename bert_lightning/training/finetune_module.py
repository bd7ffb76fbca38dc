"""The LightningModule that fine-tunes an encoder with a task head."""

from __future__ import annotations

import lightning as L
import torch
from torch import nn

from bert_lightning.model import BertConfig
from bert_lightning.tasks.kinds import make_task
from bert_lightning.training.pretrain_module import param_groups, warmup_linear_decay


class FinetuneModule(L.LightningModule):
    """`config`: BertConfig fields; `task`: the task config with what the train file fixed
    (label set, target scale); `optim`: lr, weight_decay, betas, eps, warmup_ratio.
    `freeze_encoder` trains the head only, with the encoder in eval mode (no dropout): the
    features stay those of the pretrained model. The tokenizer travels in every checkpoint, and
    `max_seq_length` (what the model was fine-tuned on) in its hyper_parameters: `bert-lightning
    score` truncates as training did."""

    def __init__(
        self,
        config: dict,
        task: dict,
        optim: dict,
        freeze_encoder: bool = False,
        tokenizer_json: str | None = None,
        max_seq_length: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer_json"])
        self.task = make_task(task)
        self.model = self.task.build_model(BertConfig(**config))
        self.tokenizer_json = tokenizer_json
        if freeze_encoder:
            self.model.bert.requires_grad_(False)
        self.split_metrics = nn.ModuleDict(
            {"val": self.task.metrics(), "test": self.task.metrics()}
        )

    def train(self, mode: bool = True):
        super().train(mode)
        if self.hparams.freeze_encoder:
            self.model.bert.eval()
        return self

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def training_step(self, batch, batch_idx):
        loss = self.task.loss(self(batch), batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].size(0))
        return loss

    def _eval_step(self, split: str, batch):
        logits = self(batch)
        B = batch["input_ids"].size(0)
        self.log(f"{split}/loss", self.task.loss(logits, batch), batch_size=B, sync_dist=True)
        self.task.update(self.split_metrics[split], logits, batch)

    def _eval_epoch_end(self, split: str):
        metrics = self.split_metrics[split]
        self.log_dict(
            {f"{split}/{k}": v for k, v in self.task.compute(metrics).items()},
            prog_bar=split == "val",
        )
        for m in metrics.values():
            m.reset()

    def validation_step(self, batch, batch_idx):
        self._eval_step("val", batch)

    def on_validation_epoch_end(self):
        self._eval_epoch_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step("test", batch)

    def on_test_epoch_end(self):
        self._eval_epoch_end("test")

    def configure_optimizers(self):
        o = self.hparams.optim
        opt = torch.optim.AdamW(
            param_groups(self.model, o.get("weight_decay", 0.01)),
            lr=o["lr"],
            betas=tuple(o.get("betas", (0.9, 0.999))),
            eps=o.get("eps", 1e-6),
        )
        total = int(self.trainer.estimated_stepping_batches)
        warmup = round(o.get("warmup_ratio", 0.1) * total)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear_decay(warmup, total))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["tokenizer"] = self.tokenizer_json

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.tokenizer_json = checkpoint.get("tokenizer", self.tokenizer_json)
