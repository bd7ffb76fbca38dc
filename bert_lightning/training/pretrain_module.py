"""The LightningModule that pretrains `BertForPreTraining` with MLM, plus NSP when
the data are sentence pairs."""

from __future__ import annotations

import torch
from torchmetrics.classification import BinaryAccuracy
from torchmetrics.text import Perplexity

from bert_lightning.model import BertConfig, BertForPreTraining, pretraining_flops
from bert_lightning.model.flops import step_counts
from bert_lightning.training.module_base import EncoderModule, Share, ValidationLoss


class BertPretrainModule(EncoderModule):
    """`config`: BertConfig fields; `optim`: the `conf/optim` config (see `optim.py`).
    `tokenizer_json` travels inside every checkpoint, so a checkpoint is self-contained.
    `nsp`: loss = MLM + NSP (the data module decides, `data.nsp`), else MLM alone, under which
    the pooler and NSP head get no gradient and are frozen, so that DDP finds no unused
    parameters.
    `compile`: torch.compile the model in place (a GPU lever; parameter names unchanged).
    A checkpoint records the objective by name (`OBJECTIVE`, checkpoint.objective_of)."""

    OBJECTIVE = "mlm"

    def __init__(
        self,
        config: dict,
        optim: dict,
        tokenizer_json: str | None = None,
        *,
        nsp: bool,
        compile: bool = False,
        data_record: dict | None = None,
    ):
        super().__init__(data_record)
        self.save_hyperparameters(ignore=["tokenizer_json", "data_record"])
        self.hparams["objective"] = self.OBJECTIVE
        self.model = BertForPreTraining(BertConfig(**config))
        self.nsp = nsp
        if not self.nsp:
            for head in (self.model.bert.pooler, self.model.cls.seq_relationship):
                head.requires_grad_(False)
        self.tokenizer_json = tokenizer_json
        self.train_acc, self.val_acc = Share(), Share()
        self.val_ppl = Perplexity(ignore_index=-100)
        if self.nsp:  # NSP accuracy (data=c4_nsp); the loss is then MLM + NSP
            # validate_args checks labels on the host: a sync per training step
            self.train_nsp_acc = BinaryAccuracy(validate_args=False)
            self.val_nsp_acc = BinaryAccuracy()
        self.val_loss = ValidationLoss(mlm=1.0, nsp=1.0) if self.nsp else ValidationLoss(mlm=1.0)
        if self.nsp:  # its terms apart
            self.val_mlm_loss, self.val_nsp_loss = ValidationLoss(mlm=1.0), ValidationLoss(nsp=1.0)

    def forward(self, batch: dict):
        return self.model(
            batch["input_ids"],
            batch.get("token_type_ids"),
            batch.get("attention_mask"),
            labels=batch["labels"],
            mlm_positions=batch["mlm_positions"],  # (B, K), the collator's
            next_sentence_label=batch.get("next_sentence_label") if self.nsp else None,
            position_ids=batch.get("position_ids"),  # packed_isolated: the documents of each row
        )

    def flops_per_batch(self, batch: dict) -> torch.Tensor:
        """Useful FLOPs of a training step on `batch` (TokenThroughput's MFU), as a device
        tensor: `pretraining_flops` is linear in its counts, so nothing is read to the host."""
        return pretraining_flops(self.model.config, **step_counts(batch))

    def training_step(self, batch, batch_idx):
        out = self(batch)
        B = batch["input_ids"].size(0)
        self.log("train/loss", out.loss, batch_size=B)
        self._mlm_acc(self.train_acc, out)
        self.log("train/mlm_acc", self.train_acc, batch_size=B)
        if self.nsp:
            self._log_nsp("train", out, batch, self.train_nsp_acc)
        return out.loss

    def validation_step(self, batch, batch_idx):
        out = self(batch)
        B, masked = batch["input_ids"].size(0), (out.mlm_labels != -100).sum()
        self.val_loss.update("mlm", out.mlm_loss, masked)
        if self.nsp:
            self.val_loss.update("nsp", out.nsp_loss, B)
            self.val_mlm_loss.update("mlm", out.mlm_loss, masked)
            self.val_nsp_loss.update("nsp", out.nsp_loss, B)
            self.log("val/mlm_loss", self.val_mlm_loss, batch_size=B)
            self.log("val/nsp_loss", self.val_nsp_loss, batch_size=B)
        self.log("val/loss", self.val_loss, prog_bar=True, batch_size=B)
        self._mlm_acc(self.val_acc, out)
        self.val_ppl(out.mlm_logits[None].float(), out.mlm_labels[None])
        self.log("val/mlm_acc", self.val_acc, batch_size=B)
        self.log("val/ppl", self.val_ppl, batch_size=B)
        if self.nsp:
            self._log_nsp("val", out, batch, self.val_nsp_acc)

    @staticmethod
    def _mlm_acc(acc: Share, out) -> None:
        hits = out.mlm_logits.detach().argmax(-1) == out.mlm_labels  # (B * K,)
        acc(hits, out.mlm_labels != -100)

    def _log_nsp(self, stage: str, out, batch: dict, acc: BinaryAccuracy) -> None:
        if out.nsp_loss is None:
            return
        B = batch["input_ids"].size(0)
        if stage == "train":  # validation's: `val_loss`
            self.log("train/mlm_loss", out.mlm_loss, batch_size=B)
            self.log("train/nsp_loss", out.nsp_loss, batch_size=B)
        acc(out.nsp_logits.detach().argmax(-1), batch["next_sentence_label"])  # (B,) vs (B,)
        self.log(f"{stage}/nsp_acc", acc, batch_size=B)
