"""Parameter counts and useful FLOPs in closed form: what MFU and the size table are computed
from, checked against the real modules in tests."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from bert_lightning.model.bert import BertConfig
from bert_lightning.model.distill import reads_last, reads_masked


def num_parameters(module: nn.Module) -> int:
    """Unique parameters (a tied weight counts once)."""
    return sum(p.numel() for p in module.parameters())


def encoder_parameter_formula(c: BertConfig, pooler: bool = True) -> int:
    """Closed form of BertModel's parameter count, checked against the model in tests."""
    H, I, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    emb = (c.vocab_size + c.max_position_embeddings + c.type_vocab_size) * H + 2 * H
    layer = 4 * (H * H + H) + 2 * H + (H * I + I) + (I * H + H) + 2 * H
    final_ln = 2 * H if c.pre_layer_norm else 0
    return emb + L * layer + final_ln + (H * H + H if pooler else 0)


def encoder_flops(
    c: BertConfig,
    batch_size: int,
    seq_len: int,
    last_rows: int | None = None,
    tokens: int | None = None,
) -> int:
    """Forward matmul FLOPs of the encoder's layers (2 per multiply-add): the dense layers and
    attention's two (T x T) products; the last layer's queries, attention output and FFN on
    `last_rows` rows (B x (1 + K): [CLS] and `mlm_positions`; None: every token), its keys
    and values on every token. `tokens`: the real tokens of a padded batch (None: B x T),
    which alone the unpadded encoder's dense layers run on; the attention products stay
    B x T x T."""
    H, I, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    N = batch_size * seq_len  # positions
    D = N if tokens is None else tokens  # what the dense layers run on
    R = D if last_rows is None else last_rows

    def layer(rows: int, queries: int) -> int:  # Q, attention output, FFN on `rows`; K, V on
        # every real token; QK^T and PV for `queries` query positions over T keys
        return (
            2 * rows * (2 * H * H + 2 * H * I) + 2 * D * 2 * H * H + 2 * 2 * queries * seq_len * H
        )

    return (L - 1) * layer(D, N) + layer(R, N if last_rows is None else last_rows)


def step_counts(batch: dict) -> dict:
    """What the FLOPs of a pretraining step depend on, from its batch, as device tensors (the
    formulas are linear in them, so nothing is read to the host): `batch_size`, `seq_len`,
    `num_picked`, `last_rows` (the last layer's: [CLS] and the K `mlm_positions` of a row, the
    rows the model runs it on) and `tokens` (the real ones, which the unpadded encoder runs
    on; None without padding)."""
    B, T = batch["input_ids"].shape
    K = batch["mlm_positions"].size(1)  # of (B, K)
    mask: torch.Tensor | None = batch.get("attention_mask")
    return {
        "batch_size": B,
        "seq_len": T,
        "num_picked": (batch["labels"] != -100).sum(),
        "last_rows": B * (1 + K),
        "tokens": None if mask is None else mask.sum(),
    }


def pretraining_flops(
    c: BertConfig,
    batch_size: int,
    seq_len: int,
    num_picked: int,
    last_rows: int | None = None,
    backward: bool = True,
    tokens: int | None = None,
) -> int:
    """Useful matmul FLOPs of one MLM+NSP step of this model (2 per multiply-add).

    Counted: the encoder (`encoder_flops`), the pooler and NSP head, and the MLM head on the
    `num_picked` positions only (what we run, not a dense head).
    Element-wise work (LayerNorm, GELU, softmax, dropout, embeddings) is left out, as in MFU.
    The backward pass costs twice the forward (gradients of inputs and of weights).
    """
    H, V = c.hidden_size, c.vocab_size
    heads = 2 * batch_size * (H * H + 2 * H) + 2 * num_picked * (H * H + H * V)
    forward = encoder_flops(c, batch_size, seq_len, last_rows, tokens) + heads
    return 3 * forward if backward else forward


def rtd_flops(
    c: BertConfig,
    g: BertConfig,
    batch_size: int,
    seq_len: int,
    num_picked: int,
    last_rows: int,
    backward: bool = True,
    tokens: int | None = None,
) -> int:
    """Useful matmul FLOPs of one replaced-token-detection step (model/electra.py): the
    generator `g` (its projection from the shared embeddings, its encoder with the last layer
    on `last_rows`, its MLM head on the `num_picked` positions) and the discriminator `c` (its
    encoder on every token (no pooler), its two-layer head on every position, padding too).
    Sampling and element-wise work are left out, as in `pretraining_flops`."""
    H, Hg, V = c.hidden_size, g.hidden_size, c.vocab_size
    D = batch_size * seq_len if tokens is None else tokens
    generator = (
        2 * D * H * Hg
        + encoder_flops(g, batch_size, seq_len, last_rows, tokens)
        + 2 * num_picked * (Hg * H + H * V)
    )
    head = 2 * batch_size * seq_len * (H * H + H)
    discriminator = encoder_flops(c, batch_size, seq_len, None, tokens) + head
    forward = generator + discriminator
    return 3 * forward if backward else forward


def distill_flops(
    s: BertConfig,
    t: BertConfig,
    batch_size: int,
    seq_len: int,
    num_picked: int,
    weights: dict[str, float],
    tokens: int | None = None,
) -> int:
    """Matmul FLOPs of one distillation step (training/distill_module.py): the student's
    forward and backward, the teacher's forward alone. Each model: its encoder (the last
    layer on [CLS] alone when no loss reads the last hidden states, and then not
    differentiated) and pooler; with a MiniLM loss (`weights`), the last layer's q, k, v
    recomputed on the padded batch and each relation's (T x T) product; the MLM head on the
    `num_picked` positions where an MLM loss reads it; the student's projections to the
    teacher's width (on every position, padding too)."""
    B, T = batch_size, seq_len
    last = reads_last(weights)
    relations = bool(weights["attention"]) + bool(weights["value_relation"])

    def extra(c: BertConfig, mlm_head: bool) -> int:  # what the losses add, forward
        H = c.hidden_size
        qkv = (2 * B * T * 3 * H * H + relations * 2 * B * T * T * H) if relations else 0
        return qkv + (2 * num_picked * (H * H + H * c.vocab_size) if mlm_head else 0)

    def forward(c: BertConfig) -> int:  # the encoder as run, and the pooler
        rows = None if last else B
        return encoder_flops(c, B, T, rows, tokens) + 2 * B * c.hidden_size**2

    last_off = replace(s, num_hidden_layers=s.num_hidden_layers - 1)
    differentiated = encoder_flops(s if last else last_off, B, T, None, tokens)
    rows = (
        bool(weights["hidden"]) * (s.num_hidden_layers + 1) * B * T + bool(weights["embedding"]) * B
    )
    projections = 2 * s.hidden_size * t.hidden_size * rows
    mlm = reads_masked(weights)
    student = forward(s) + 2 * differentiated + 3 * (extra(s, mlm) + projections)
    return student + forward(t) + extra(t, bool(weights["soft_mlm"]))
