"""The LightningModule that distills a frozen teacher encoder into a student (`objective=distill`,
the losses in model/distill.py) on the MLM data of any data option."""

from __future__ import annotations

import torch
from torch import nn

from bert_lightning.checkpoint import Checkpoint
from bert_lightning.errors import UserError
from bert_lightning.model import BertConfig, BertForPreTraining, distill_flops
from bert_lightning.model.bert import gather_positions, mlm_loss
from bert_lightning.model.distill import (
    embedding_cosine,
    hidden_mse,
    last_layer_qkv,
    layer_map,
    mean_pool,
    reads_last,
    reads_masked,
    relation_kl,
    relation_logits,
    soft_mlm,
)
from bert_lightning.private_api import MovesKept
from bert_lightning.training.module_base import EncoderModule, ValidationLoss
from bert_lightning.weights import load_weights

LOSSES = ("attention", "value_relation", "hidden", "embedding", "soft_mlm", "mlm")


def projection(width: int, teacher_width: int) -> nn.Linear:
    """Student width -> teacher width, learned; the identity where the widths agree, so that a
    student that is a copy of its teacher starts at zero loss."""
    p = nn.Linear(width, teacher_width, bias=False)
    if width == teacher_width:
        nn.init.eye_(p.weight)
    else:
        nn.init.normal_(p.weight, 0.0, width**-0.5)
    return p


def frozen_teacher(ckpt: Checkpoint, soft_mlm: float) -> BertForPreTraining:
    """A teacher's encoder and MLM head (not a task's head) in eval mode, without gradient;
    `soft_mlm` takes its targets from the head."""
    if soft_mlm and not ckpt.has_mlm_head:
        raise UserError(
            f"objective.soft_mlm={soft_mlm}: {ckpt.source} has no MLM head "
            "(cls.predictions.*) to take soft targets from"
        )
    model = BertForPreTraining(ckpt.config)
    load_weights(model, ckpt)
    return model.eval().requires_grad_(False)


class DistillModule(MovesKept, EncoderModule):
    """`config`: the student's BertConfig fields (a `BertForPreTraining`, the encoder its
    checkpoints hand on); `teacher`: the path of a Hugging Face BERT folder or a `.ckpt` of
    ours (recorded: a resumed run keeps it), `teacher_ckpt` its contents, read by the caller
    (`training/start.py`), and `teacher_digest` its file's (recorded: a resumed run checks
    it); the teacher is held in eval mode without gradient and outside the module's
    children: it is in no checkpoint, optimizer or DDP bucket. The losses'
    weights (`LOSSES`; 0 computes nothing), `temperature` (of `soft_mlm`), `relation_heads`
    (MiniLM's re-split heads; None: the student's head count), `student_layers` (the
    teacher's layers the student started from) and `embeddings_from_teacher` (recorded;
    `build` starts the student from them) are
    `conf/objective/distill.yaml`'s. The other arguments as `BertPretrainModule`'s; NSP labels
    (`nsp`, `data=c4_nsp`) are not used."""

    OBJECTIVE = "distill"
    kept = ("teacher",)  # moved to the student's device and dtype (MovesKept)

    def __init__(
        self,
        config: dict,
        optim: dict,
        teacher: str,
        attention: float,
        value_relation: float,
        hidden: float,
        embedding: float,
        soft_mlm: float,
        mlm: float,
        temperature: float,
        relation_heads: int | None,
        student_layers: list[int] | None,
        embeddings_from_teacher: bool,
        tokenizer_json: str | None = None,
        *,
        nsp: bool,
        compile: bool = False,
        data_record: dict | None = None,
        teacher_ckpt: Checkpoint,
        teacher_digest: str | None = None,
    ):
        super().__init__(data_record)
        if student_layers is not None:  # a plain list: checkpoints load weights-only
            student_layers = [int(i) for i in student_layers]
        self.save_hyperparameters(ignore=["tokenizer_json", "teacher_ckpt", "data_record"])
        self.hparams["objective"] = self.OBJECTIVE
        self.weights = {k: float(self.hparams[k]) for k in LOSSES}
        if not any(self.weights.values()):
            raise UserError(f"objective: every loss weight is 0; set one of {list(LOSSES)}")
        self.tokenizer_json = tokenizer_json
        self.model = BertForPreTraining(BertConfig(**config))
        # set past nn.Module's __setattr__, which would register it as a child
        object.__setattr__(self, "teacher", frozen_teacher(teacher_ckpt, soft_mlm))
        s, t = self.model.config, teacher_ckpt.config
        self.relation_heads = R = relation_heads or s.num_attention_heads
        if (attention or value_relation) and (s.hidden_size % R or t.hidden_size % R):
            raise UserError(
                f"objective.relation_heads={R} must divide both widths (student {s.hidden_size}, "
                f"teacher {t.hidden_size})"
            )
        self.pairs = layer_map(s.num_hidden_layers, t.num_hidden_layers)
        self.projections = nn.ModuleDict(
            {
                k: projection(s.hidden_size, t.hidden_size)
                for k in ("hidden", "embedding")
                if self.weights[k]
            }
        )
        self.freeze_unused()
        # each term a mean over the whole set's units (`units`), whatever the batching
        on = {k: v for k, v in self.weights.items() if v}
        self.val_loss = ValidationLoss(**on)
        self.val_terms = nn.ModuleDict({k: ValidationLoss(**{k: 1.0}) for k in on})

    def freeze_unused(self) -> None:
        """What no loss reaches gets no gradient, and DDP would stop on it: the pooler and NSP
        head always; the MLM head's own weights without an MLM loss (its decoder is the word
        embeddings); without a loss on the last hidden states, the last layer past its
        queries, keys and values (MiniLM's attention losses end there)."""
        m = self.model
        frozen = [m.bert.pooler, m.cls.seq_relationship]
        if not self.masked:
            frozen.append(m.cls.predictions.transform)
            m.cls.predictions.bias.requires_grad_(False)
        if not self.reads_last:
            last = m.bert.encoder.layer[-1]
            frozen += [last.attention.output.dense, last.intermediate, last.output]
            if not m.config.pre_layer_norm:  # post-LN: after the attention; pre-LN: before it
                frozen.append(last.attention.output.LayerNorm)
            if m.bert.encoder.LayerNorm is not None:
                frozen.append(m.bert.encoder.LayerNorm)
        for module in frozen:
            module.requires_grad_(False)

    @property
    def bert(self):
        return self.model.bert

    def trained(self) -> nn.Module:
        """The student and the projections (heads of the optimizer's groups)."""
        return self

    def configure_model(self) -> None:
        if self.device_mesh is not None:
            raise UserError("objective=distill runs with DDP (trainer=ddp), not trainer=fsdp")
        super().configure_model()

    @property
    def reads_last(self) -> bool:
        """Whether a loss reads the last hidden states (model/distill.py `READS_LAST`)."""
        return reads_last(self.weights)

    @property
    def masked(self) -> bool:
        """Whether the models read the masked text (model/distill.py `MASKED`)."""
        return reads_masked(self.weights)

    def forward(self, batch: dict) -> dict[str, torch.Tensor]:
        """Each loss with a weight (student and teacher on the same tokens), and `loss`, their
        weighted sum."""
        ids, labels = batch["input_ids"], batch["labels"]
        if not self.masked:  # the original text back where the collator masked
            ids = torch.where(labels != -100, labels, ids)
        tt, am, pos = (
            batch.get("token_type_ids"),
            batch.get("attention_mask"),
            batch.get("position_ids"),
        )
        # MiniLM's losses alone read the last layer's input: its output only for [CLS]
        rows = None if self.reads_last else ids.new_zeros(ids.size(0), 1)  # (B, 1)
        run = dict(output_hidden_states=True, last_rows=rows, position_ids=pos)
        with torch.no_grad():
            t = self.teacher.bert(ids, tt, am, **run)
        s = self.model.bert(ids, tt, am, **run)
        tokens = torch.ones_like(ids, dtype=torch.bool) if am is None else am.bool()  # (B, T)
        w, losses = self.weights, {}
        if w["attention"] or w["value_relation"]:
            _, mask = self.model.bert.attention_inputs(ids, am, pos)
            losses.update(self.relation_losses(s, t, mask, tokens))
        if w["hidden"]:
            losses["hidden"] = self.hidden_loss(s, t, tokens)
        if w["embedding"]:
            losses["embedding"] = self.embedding_loss(s, t, tokens)
        if self.masked:
            losses.update(self.mlm_losses(s, t, batch))
        losses["loss"] = sum(w[k] * v for k, v in losses.items())
        return losses

    def relation_losses(self, s, t, mask, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
        """MiniLM's: the KL of the last layer's query-key relations (`attention`, its
        self-attention) and value-value ones (`value_relation`), both models re-split into
        `relation_heads` heads; `mask`: the encoder's attention mask, `tokens` (B, T) the real
        query positions."""
        R = self.relation_heads
        qs, ks, vs = last_layer_qkv(self.model.bert, s.hidden_states[-2])  # 3 x (B, T, Hs)
        with torch.no_grad():
            qt, kt, vt = last_layer_qkv(self.teacher.bert, t.hidden_states[-2])  # 3 x (B, T, Ht)
        pairs = {"attention": (qt, kt, qs, ks), "value_relation": (vt, vt, vs, vs)}
        return {
            name: relation_kl(
                relation_logits(a_t, b_t, R, mask), relation_logits(a_s, b_s, R, mask), tokens
            )
            for name, (a_t, b_t, a_s, b_s) in pairs.items()
            if self.weights[name]
        }

    def hidden_loss(self, s, t, tokens: torch.Tensor) -> torch.Tensor:
        """TinyBERT's: the MSE of the mapped layers' hidden states (`pairs`), the student's
        projected to the teacher's width."""
        project = self.projections["hidden"]
        return hidden_mse(s.hidden_states, t.hidden_states, project, self.pairs, tokens)

    def embedding_loss(self, s, t, tokens: torch.Tensor) -> torch.Tensor:
        """1 - cos of the mean-pooled last hidden states, the student's projected."""
        pooled = self.projections["embedding"](mean_pool(s.last_hidden_state, tokens))  # (B, Ht)
        return embedding_cosine(pooled, mean_pool(t.last_hidden_state, tokens))

    def mlm_losses(self, s, t, batch: dict) -> dict[str, torch.Tensor]:
        """The MLM heads' losses on the static (B, K) `mlm_positions`, as pretraining's:
        DistilBERT's KL to the teacher's softened distribution (`soft_mlm`) and the student's
        own cross-entropy (`mlm`)."""
        positions = batch["mlm_positions"]  # (B, K), the collator's
        picked = gather_positions(batch["labels"], positions).flatten()  # (B * K,), -100 past

        def at_positions(h):  # (B, T, H) -> (B * K, H)
            return gather_positions(h, positions).flatten(0, 1)

        logits = self.model.cls.predictions(at_positions(s.last_hidden_state))  # (B * K, V)
        losses = {}
        if self.weights["soft_mlm"]:
            with torch.no_grad():
                t_logits = self.teacher.cls.predictions(at_positions(t.last_hidden_state))
            V = min(logits.size(-1), t_logits.size(-1))  # a teacher may pad its vocabulary
            losses["soft_mlm"] = soft_mlm(
                logits[:, :V], t_logits[:, :V], self.hparams.temperature, picked != -100
            )
        if self.weights["mlm"]:
            losses["mlm"] = mlm_loss(logits, picked)
        return losses

    def flops_per_batch(self, batch: dict) -> torch.Tensor:
        """Useful FLOPs of a step (TokenThroughput's MFU), the teacher's forward counted, as
        a device tensor."""
        B, T = batch["input_ids"].shape
        mask = batch.get("attention_mask")
        flops = distill_flops(
            self.model.config,
            self.teacher.config,
            B,
            T,
            (batch["labels"] != -100).sum(),
            self.weights,
            tokens=None if mask is None else mask.sum(),
        )
        return torch.as_tensor(flops, device=batch["input_ids"].device)  # an int without masks

    def units(self, batch: dict) -> dict[str, torch.Tensor | int]:
        """How many items each weighted loss of `batch` is a mean of (model/distill.py), for
        `ValidationLoss`: the relation and hidden losses real tokens (their heads, layers and
        width a fixed factor), the embedding loss rows, the MLM losses picked positions."""
        ids, am = batch["input_ids"], batch.get("attention_mask")
        tokens = ids.numel() if am is None else am.sum()  # () of (B, T)
        picked = (batch["labels"] != -100).sum()  # () of (B, T)
        every = dict(attention=tokens, value_relation=tokens, hidden=tokens)
        every |= dict(embedding=ids.size(0), soft_mlm=picked, mlm=picked)
        return {k: n for k, n in every.items() if self.weights[k]}

    def training_step(self, batch, batch_idx):
        losses = self(batch)
        B = batch["input_ids"].size(0)
        for k, v in losses.items():
            self.log(f"train/{k}", v, batch_size=B)
        return losses["loss"]

    def validation_step(self, batch, batch_idx):
        losses, B = self(batch), batch["input_ids"].size(0)
        for k, n in self.units(batch).items():
            self.val_loss.update(k, losses[k], n)
            self.val_terms[k].update(k, losses[k], n)
            self.log(f"val/{k}", self.val_terms[k], batch_size=B)
        self.log("val/loss", self.val_loss, prog_bar=True, batch_size=B)
