"""ELECTRA's replaced-token detection (RTD, Clark et al. 2020), in plain torch.

A small generator (a narrower BERT MLM) fills the picked positions with tokens sampled from its
own predictions; the discriminator, a full-size BERT encoder, tells for every real position
whether its token is the original or a replacement. The discriminator learns from every
position instead of the 15-30% MLM picks, which is where ELECTRA's gain on small budgets comes
from; it is the encoder that fine-tuning and `export-hf` take (`bert.*`, a `BertModel`).

The two share the embedding layer (token, position and type embeddings, its LayerNorm), and
the generator's output projection is tied to the word embeddings, as in ELECTRA. Names follow
Hugging Face's ELECTRA classes (`discriminator_predictions.dense_prediction`,
`generator_predictions`, `generator_lm_head`, `embeddings_project`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from bert_lightning.errors import UserError
from bert_lightning.model.bert import (
    ACT2FN,
    BertConfig,
    BertEncoder,
    BertModel,
    LayerNorm,
    gather_positions,
    init_weights,
    mlm_loss,
)


def generator_config(config: BertConfig, generator_hidden_size: float) -> BertConfig:
    """The generator's shape: the discriminator's depth at `generator_hidden_size` of its width
    (ELECTRA: 1/4 to 1/2 works best), heads and feed-forward width scaled alike."""
    if not 0 < generator_hidden_size <= 1:
        raise UserError(
            f"objective.generator_hidden_size={generator_hidden_size}; expected a share of the "
            "encoder's width in (0, 1]"
        )
    H = round(config.hidden_size * generator_hidden_size)
    heads = max(1, round(config.num_attention_heads * generator_hidden_size))
    if H < 1 or H % heads:
        raise UserError(
            f"objective.generator_hidden_size={generator_hidden_size} gives a generator of width "
            f"{H} with {heads} heads: the width must be a positive multiple of the heads"
        )
    intermediate = max(1, round(config.intermediate_size * generator_hidden_size))
    return replace(config, hidden_size=H, num_attention_heads=heads, intermediate_size=intermediate)


class ElectraGeneratorPredictions(nn.Module):
    """Generator width -> embedding width (the tied output projection's input)."""

    def __init__(self, config: BertConfig, embedding_size: int):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, embedding_size)
        self.activation = ACT2FN[config.hidden_act]
        self.LayerNorm = LayerNorm(embedding_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.activation(self.dense(x)))


class ElectraGenerator(nn.Module):
    """A narrow BERT MLM on the discriminator's embeddings: `embeddings_project` maps them to its
    width; its vocabulary projection is the word embedding matrix (tied)."""

    def __init__(self, config: BertConfig, embedding_size: int, word_embeddings: nn.Embedding):
        super().__init__()
        self.config = config
        self.embeddings_project = nn.Linear(embedding_size, config.hidden_size)
        self.encoder = BertEncoder(config)
        self.generator_predictions = ElectraGeneratorPredictions(config, embedding_size)
        self.generator_lm_head = nn.Linear(embedding_size, config.vocab_size)
        init_weights(self, config.initializer_range)
        self.generator_lm_head.weight = word_embeddings.weight  # tied, as in ELECTRA

    def forward(self, embedded, attn_mask, rows, unpadded):
        """`embedded` (B, T, E) or (N, E) unpadded; `rows` (B, R): the positions to predict
        (the last layer runs on those alone) -> (B, R, Hg), what `logits` reads."""
        h = self.embeddings_project(embedded)  # (B, T, Hg) or (N, Hg)
        return self.encoder(h, attn_mask, last_rows=rows, unpadded=unpadded)[0]  # (B, R, Hg)

    def logits(self, h):
        return self.generator_lm_head(self.generator_predictions(h))  # (..., V)


class ElectraDiscriminatorPredictions(nn.Module):
    """One logit per token: replaced (> 0) or original."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.dense_prediction = nn.Linear(config.hidden_size, 1)

    def forward(self, x):
        return self.dense_prediction(self.activation(self.dense(x))).squeeze(-1)  # (...,)


@dataclass
class RTDOutput:
    loss: torch.Tensor  # gen_loss + disc_weight * disc_loss
    gen_loss: torch.Tensor  # the generator's MLM cross-entropy at the picked positions
    disc_loss: torch.Tensor  # binary cross-entropy over every real position
    gen_logits: torch.Tensor  # (B * K, V) at the `mlm_positions`
    gen_labels: torch.Tensor  # (B * K,) the original ids there, -100 past a row's picks
    disc_logits: torch.Tensor  # (B, T) one a position, padding's unused
    replaced: torch.Tensor  # (B, T) bool: the discriminator's labels
    real: torch.Tensor  # (B, T) bool: the real positions, which the discriminator learns from
    corrupted: torch.Tensor  # (B, T) the discriminator's input


def sample_tokens(probs: torch.Tensor, u: torch.Tensor | None = None) -> torch.Tensor:
    """(P, V) distributions -> (P,) one draw from each, by inverse CDF: one uniform number per
    row (`u`, (P,) in [0, 1), else the global RNG's; `torch.multinomial` draws V exponentials
    per row, several times slower on a CPU at a vocabulary's width). A token of probability 0
    is never drawn."""
    cdf = probs.cumsum(-1)  # (P, V)
    u = torch.rand(probs.size(0), device=probs.device) if u is None else u  # (P,)
    drawn = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)  # (P, 1)
    return drawn.squeeze(1).clamp_(max=probs.size(1) - 1)  # (P,)


_P, _A = 2_147_483_629, 48_271  # a prime under 2**31 and a multiplier: products fit in int64
_MASK, _MIX = 2**31 - 1, (0x2C1B3C6D, 0x297A2D39, 0x1B873593)  # 31-bit hash steps


def row_uniforms(original: torch.Tensor, real: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """(B, T) token ids and (B, T) bool real -> (B, k) numbers in [0, 1), each a hash of its
    row's real tokens, its pick's index and `seed` alone: a row draws the same tokens in a
    batch of any size, on any rank (a validation loss that no batching changes)."""
    T, powers = original.size(1), [1]
    for _ in range(T - 1):
        powers.append(powers[-1] * _A % _P)
    weights = torch.tensor(powers, device=original.device)  # (T,)
    tokens = (original.long() + 1) * real  # (B, T), 0 at padding
    row = (tokens * weights % _P).sum(-1) % _P  # (B,)
    picks = torch.arange(1, k + 1, device=original.device)  # (k,)
    x = (row[:, None] * _A + picks * 16_807 + seed % _P) % _P  # (B, k)
    for m in _MIX:  # xor-shift and multiply (an affine map alone keeps picks on a lattice)
        x = ((x ^ (x >> 15)) * m) & _MASK
    return (x ^ (x >> 15)).double() / (_MASK + 1)  # (B, k)


def corrupt(input_ids, labels, positions, sampled) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) the original text with the picked ones of `positions` (B, K) set to `sampled`
    (B, K), and (B, T) bool which tokens now differ from the original: a sample equal to the
    original token counts as original, as in ELECTRA."""
    original = torch.where(labels != -100, labels, input_ids)  # (B, T)
    kept = gather_positions(original, positions)  # (B, K)
    new = torch.where(gather_positions(labels, positions) != -100, sampled, kept)  # (B, K)
    corrupted = original.scatter(1, positions, new)  # (B, T)
    return corrupted, corrupted != original


class ElectraForPreTraining(nn.Module):
    """Generator and discriminator, trained together: loss = generator MLM + `disc_weight` x
    discriminator BCE (ELECTRA: 50). The generator is sampled without gradient (the
    discriminator's loss does not reach it through its samples), from torch's global RNG, so
    a run reseeded per batch resumes bitwise."""

    def __init__(self, config: BertConfig, generator_hidden_size: float, disc_weight: float):
        super().__init__()
        self.config, self.disc_weight = config, disc_weight
        # the discriminator; no pooler, as ELECTRA's (fine-tuning starts a `cls` head's afresh)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.discriminator_predictions = ElectraDiscriminatorPredictions(config)
        init_weights(self.discriminator_predictions, config.initializer_range)
        self.generator = ElectraGenerator(
            generator_config(config, generator_hidden_size),
            config.hidden_size,
            self.bert.embeddings.word_embeddings,
        )

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        *,
        labels,
        mlm_positions,
        position_ids=None,
        seed: int | None = None,
        unpad=True,
    ) -> RTDOutput:
        """`input_ids` (B, T): the masked text (MLMCollator's), `labels` (B, T): the original
        ids at the picked positions, -100 elsewhere; `mlm_positions` (B, K) where the generator
        predicts (as `BertForPreTraining`'s). `seed`: the generator's draws fixed by each row and
        the seed (`row_uniforms`), instead of the global RNG's (a comparable validation loss)."""
        rows = F.pad(mlm_positions, (1, 0))  # (B, 1 + K): [CLS] first, as BertForPreTraining
        unpadded, mask = self.bert.attention_inputs(input_ids, attention_mask, position_ids, unpad)
        embedded = self.bert.embeddings(input_ids, token_type_ids, unpadded, position_ids)
        h = self.generator(embedded, mask, rows, unpadded)[:, 1:]  # (B, K, Hg)
        gen_labels = gather_positions(labels, mlm_positions)  # (B, K), -100 past a row's picks
        gen_logits = self.generator.logits(h.flatten(0, 1))  # (B * K, V)
        gen_loss = mlm_loss(gen_logits, gen_labels.flatten())
        real = (
            torch.ones_like(input_ids, dtype=torch.bool)
            if attention_mask is None
            else attention_mask.bool()
        )  # (B, T)
        with torch.no_grad():
            original = torch.where(labels != -100, labels, input_ids)  # (B, T)
            u = None
            if seed is not None:
                u = row_uniforms(original, real, mlm_positions.size(1), seed).flatten()  # (B*K,)
            sampled = sample_tokens(gen_logits.float().softmax(-1), u)  # (B * K,)
        corrupted, replaced = corrupt(
            input_ids, labels, mlm_positions, sampled.view_as(mlm_positions)
        )  # (B, T) each
        out = self.bert(
            corrupted, token_type_ids, attention_mask, position_ids=position_ids, unpad=unpad
        )
        disc_logits = self.discriminator_predictions(out.last_hidden_state)  # (B, T)
        bce = F.binary_cross_entropy_with_logits(
            disc_logits.float(), replaced.float(), reduction="none"
        )  # (B, T)
        disc_loss = (bce * real).sum() / real.sum().clamp(min=1)
        loss = gen_loss + self.disc_weight * disc_loss
        return RTDOutput(
            loss,
            gen_loss,
            disc_loss,
            gen_logits,
            gen_labels.flatten(),
            disc_logits,
            replaced,
            real,
            corrupted,
        )
