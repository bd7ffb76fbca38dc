"""The LightningModule that fine-tunes an encoder with a task head. What it writes is used
without it: `inference.load_finetuned` builds the model as its task does."""

from __future__ import annotations

from dataclasses import asdict

import torch
from torch import nn

from bert_lightning.model import BertConfig
from bert_lightning.tasks.kinds import Task, make_task
from bert_lightning.training.module_base import EncoderModule


class FinetuneModule(EncoderModule):
    """`config`: BertConfig fields; `task`: the run's Task (finetune.py builds it once, to read
    the data) or the task config a checkpoint stores, with what the train file fixed (label
    set, target scale): the hyper_parameters hold that config either way; `optim`: the
    `conf/optim` config (see `optim.py`).
    `freeze_encoder` trains the head only, with the encoder in eval mode (no dropout): the
    features stay those of the pretrained model. The tokenizer travels in every checkpoint, and
    `max_seq_length` (what the model was fine-tuned on) in its hyper_parameters: `bert-lightning
    score` truncates as training did. `start`: the pretrained checkpoint the run's first part
    started from (path, digest, step, source), recorded for `interpolate`; None: random weights."""

    def __init__(
        self,
        config: dict,
        task: Task | dict,
        optim: dict,
        freeze_encoder: bool,
        tokenizer_json: str | None = None,
        max_seq_length: int | None = None,
        data_record: dict | None = None,
        start: dict | None = None,
    ):
        super().__init__(data_record)
        self.task = task if isinstance(task, Task) else make_task(task)
        self.save_hyperparameters(
            {
                "config": config,
                "task": asdict(self.task.cfg),
                "optim": optim,
                "freeze_encoder": freeze_encoder,
                "max_seq_length": max_seq_length,
            }
        )
        if start is not None:  # the pretrained checkpoint of the run's first part, recorded
            self.hparams["start"] = start
        self.model = self.task.build_model(BertConfig(**config))
        self.tokenizer_json = tokenizer_json
        if freeze_encoder:
            self.model.bert.requires_grad_(False)
        self.split_metrics = nn.ModuleDict(
            {"val": self.task.metrics(), "test": self.task.metrics()}
        )
        # each split's loss over all its rows, whatever eval_batch_size cuts them into
        self.split_losses = nn.ModuleDict(
            {"val": self.task.loss_metric(), "test": self.task.loss_metric()}
        )

    @property
    def init_from(self) -> str | None:
        """Where the encoder's weights came from (`start`), as `results.json` names it."""
        start = self.hparams.get("start")
        return start and start.get("source", start["path"])

    def train(self, mode: bool = True):
        super().train(mode)
        if self.hparams.freeze_encoder:
            self.model.bert.eval()
        return self

    def forward(self, batch: dict) -> torch.Tensor:
        return self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])

    def training_step(self, batch, batch_idx):
        _, rows = self.task.logits_and_rows(self.model, batch)
        loss = self.task.loss_of(rows)
        self.log("train/loss", loss, batch_size=batch["input_ids"].size(0))
        return loss

    def _eval_step(self, split: str, batch):
        logits, rows = self.task.logits_and_rows(self.model, batch)
        self.split_losses[split].update(rows)
        self.task.update(self.split_metrics[split], logits, batch)

    def _eval_epoch_end(self, split: str):
        metrics, loss = self.split_metrics[split], self.split_losses[split]
        self.log(f"{split}/loss", loss.compute())
        self.log_dict(
            {f"{split}/{k}": v for k, v in self.task.compute(metrics).items()},
            prog_bar=split == "val",
        )
        for m in [*metrics.values(), loss]:
            m.reset()

    def validation_step(self, batch, batch_idx):
        self._eval_step("val", batch)

    def on_validation_epoch_end(self):
        super().on_validation_epoch_end()
        self._eval_epoch_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step("test", batch)

    def on_test_epoch_end(self):
        self._eval_epoch_end("test")
