"""The LightningModule that pretrains with ELECTRA's replaced-token detection
(`objective=rtd`, model/electra.py) on the MLM data of any data option."""

from __future__ import annotations

import torch
from torch import nn

from bert_lightning.errors import UserError
from bert_lightning.model import BertConfig, ElectraForPreTraining, rtd_flops
from bert_lightning.model.flops import step_counts
from bert_lightning.training.module_base import EncoderModule, Share, ValidationLoss

SHARES = ("replaced", "gen_mlm_acc", "disc_acc")  # logged per stage


class RTDPretrainModule(EncoderModule):
    """`config`: the discriminator's BertConfig fields (the encoder a checkpoint hands to
    fine-tuning and `export-hf`); `generator_hidden_size`: the generator's width as a share of
    it; `disc_weight`: λ of loss = generator MLM + λ · discriminator BCE. `nsp`: the data module's
    examples train NSP too (`data.nsp`); RTD takes MLM examples only. The other arguments as
    `BertPretrainModule`'s."""

    OBJECTIVE = "rtd"

    def __init__(
        self,
        config: dict,
        optim: dict,
        generator_hidden_size: float,
        disc_weight: float,
        tokenizer_json: str | None = None,
        *,
        nsp: bool,
        compile: bool = False,
        data_record: dict | None = None,
    ):
        super().__init__(data_record)
        if nsp:
            raise UserError(
                "objective=rtd trains on masked text; this data option makes NSP examples "
                "(data=c4_nsp: data.nsp=false gives its pairs without NSP)"
            )
        self.save_hyperparameters(ignore=["tokenizer_json", "data_record"])
        self.hparams["objective"] = self.OBJECTIVE
        self.model = ElectraForPreTraining(BertConfig(**config), generator_hidden_size, disc_weight)
        self.tokenizer_json = tokenizer_json
        self.shares = nn.ModuleDict(  # "{stage}_{name}": the shares `_log` logs
            {f"{s}_{n}": Share() for s in ("train", "val") for n in SHARES}
        )
        self.val_loss = ValidationLoss(gen=1.0, disc=disc_weight)
        self.val_gen_loss, self.val_disc_loss = ValidationLoss(gen=1.0), ValidationLoss(disc=1.0)

    def forward(self, batch: dict, seed: int | None = None):
        return self.model(
            batch["input_ids"],
            batch.get("token_type_ids"),
            batch.get("attention_mask"),
            labels=batch["labels"],
            mlm_positions=batch["mlm_positions"],  # (B, K), the collator's
            position_ids=batch.get("position_ids"),
            seed=seed,
        )

    def flops_per_batch(self, batch: dict) -> torch.Tensor:
        """Useful FLOPs of a training step (TokenThroughput's MFU), as a device tensor."""
        m = self.model
        return rtd_flops(m.config, m.generator.config, **step_counts(batch))

    def training_step(self, batch, batch_idx):
        out = self(batch)
        self._log("train", out, batch)
        return out.loss

    def validation_step(self, batch, batch_idx):
        """The generator's draws are fixed by each row and the data's seed (its data record's),
        as the masks are (`mask_once`): the validation loss is comparable across evaluations,
        and the same at any batch size and number of processes."""
        out = self(batch, (self.data_record or {}).get("data.seed", 0))
        B, picked, real = batch["input_ids"].size(0), (out.gen_labels != -100).sum(), out.real.sum()
        for metric in (self.val_loss, self.val_gen_loss):
            metric.update("gen", out.gen_loss, picked)
        for metric in (self.val_loss, self.val_disc_loss):
            metric.update("disc", out.disc_loss, real)
        self.log("val/loss", self.val_loss, prog_bar=True, batch_size=B)
        self.log("val/gen_mlm_loss", self.val_gen_loss, batch_size=B)
        self.log("val/disc_loss", self.val_disc_loss, batch_size=B)
        self._log("val", out, batch)

    def _log(self, stage: str, out, batch: dict) -> None:
        B = batch["input_ids"].size(0)
        if stage == "train":  # validation's: `val_loss`
            self.log("train/loss", out.loss, batch_size=B)
            self.log("train/gen_mlm_loss", out.gen_loss, batch_size=B)
            self.log("train/disc_loss", out.disc_loss, batch_size=B)
        hits = {  # name: (hits, what counts)
            "replaced": (out.replaced, out.real),  # (B, T) each: of the real tokens
            "gen_mlm_acc": (
                out.gen_logits.detach().argmax(-1) == out.gen_labels,
                out.gen_labels != -100,
            ),
            "disc_acc": ((out.disc_logits.detach() > 0) == out.replaced, out.real),  # (B, T)
        }
        for name in SHARES:
            metric = self.shares[f"{stage}_{name}"]
            metric(*hits[name])
            self.log(f"{stage}/{name}", metric, batch_size=B)
