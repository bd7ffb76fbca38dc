"""A BERT encoder with MLM and NSP heads, in plain torch.

Module and parameter names mirror Hugging Face `modeling_bert.py`, so a BERT checkpoint maps onto
this model by name alone; config fields carry `transformers.BertConfig` names for the same reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bert_lightning.errors import UserError


@dataclass
class BertConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # exact (erf) GELU, as the original BERT
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Not in transformers.BertConfig: pre-LN blocks (LayerNorm before each sublayer plus a final
    # one) train more stably at depth but cannot be expressed by HF BERT.
    pre_layer_norm: bool = False
    # transformers' name for a left-to-right model; here it only adds a causal attention mask,
    # an ablation that shows what MLM gains from seeing the right context
    is_decoder: bool = False

    def __post_init__(self):
        if self.hidden_size % self.num_attention_heads:
            raise UserError(
                f"hidden_size ({self.hidden_size}) must be a multiple of "
                f"num_attention_heads ({self.num_attention_heads})"
            )
        if self.hidden_act not in ACT2FN:
            raise UserError(f"hidden_act={self.hidden_act!r}; expected one of {sorted(ACT2FN)}")

    def to_dict(self) -> dict:
        return asdict(self)


ACT2FN = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids, token_type_ids=None):
        T = input_ids.size(1)
        if self.position_embeddings.num_embeddings < T:
            raise UserError(
                f"sequence length {T} exceeds max_position_embeddings "
                f"{self.position_embeddings.num_embeddings}"
            )
        x = self.word_embeddings(input_ids)  # (B, T, H)
        x = x + self.position_embeddings.weight[:T]  # (T, H) broadcast over B
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x, attn_mask=None, x_q=None):
        """`x_q` (B, R, H): the rows that query, default all of `x`; keys and values always
        come from every token of `x`."""
        B, T, H = x.shape
        nh = self.num_heads
        x_q = x if x_q is None else x_q
        R = x_q.size(1)
        q = self.query(x_q).view(B, R, nh, H // nh).transpose(1, 2)  # (B, nh, R, hs)
        k = self.key(x).view(B, T, nh, H // nh).transpose(1, 2)  # (B, nh, T, hs)
        v = self.value(x).view(B, T, nh, H // nh).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout_p if self.training else 0.0
        )  # (B, nh, R, hs)
        return y.transpose(1, 2).reshape(B, R, H)  # (B, R, H)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x):
        return self.act(self.dense(x))  # (B, T, I)


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class BertLayer(nn.Module):
    """One block. Post-LN (BERT): x = LN(x + f(x)). Pre-LN: x = x + f(LN(x)), reusing the same
    LayerNorm modules so that parameter names stay those of HF BERT. With `rows` (B, R)
    positions, only those rows are computed (queries, FFN), attending to every token."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_ln = config.pre_layer_norm
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, attn_mask=None, rows=None):
        att_out, ffn_out = self.attention.output, self.output

        def select(t):  # (B, T, H) -> (B, R, H)
            return t if rows is None else t.gather(1, rows[..., None].expand(-1, -1, t.size(-1)))

        if self.pre_ln:
            ln = att_out.LayerNorm(x)
            h = self.attention.self(ln, attn_mask, None if rows is None else select(ln))
            x = select(x) + att_out.dropout(att_out.dense(h))
            h = self.intermediate(ffn_out.LayerNorm(x))
            return x + ffn_out.dropout(ffn_out.dense(h))
        h = self.attention.self(x, attn_mask, None if rows is None else select(x))  # (B, R, H)
        x = att_out.LayerNorm(select(x) + att_out.dropout(att_out.dense(h)))
        h = self.intermediate(x)  # (B, T, I)
        return ffn_out.LayerNorm(x + ffn_out.dropout(ffn_out.dense(h)))


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # pre-LN leaves the residual stream un-normalised: one LayerNorm closes it
        self.LayerNorm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            if config.pre_layer_norm
            else None
        )

    def forward(self, x, attn_mask=None, output_hidden_states=False, last_rows=None):
        """`last_rows` (B, R): the last layer computes only these positions."""
        hidden_states = [x] if output_hidden_states else None
        for i, layer in enumerate(self.layer):
            if i == len(self.layer) - 1 and last_rows is not None:
                x = layer(x, query_mask(attn_mask, last_rows), last_rows)
            else:
                x = layer(x, attn_mask)
            if output_hidden_states:
                hidden_states.append(x)
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
            if output_hidden_states:
                hidden_states[-1] = x
        return x, hidden_states


def query_mask(attn_mask: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """A mask with a query dimension ((B, 1, T, T), causal) keeps the queried rows (B, R)."""
    if attn_mask is None or attn_mask.size(-2) == 1:
        return attn_mask
    B, T = rows.size(0), attn_mask.size(-1)
    full = attn_mask.expand(B, 1, attn_mask.size(-2), T)  # (B, 1, T, T)
    return full.gather(2, rows[:, None, :, None].expand(-1, 1, -1, T))  # (B, 1, R, T)


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, x):
        return torch.tanh(self.dense(x[:, 0]))  # (B, H) from [CLS]


@dataclass
class EncoderOutput:
    last_hidden_state: torch.Tensor  # (B, T, H)
    pooler_output: torch.Tensor | None  # (B, H)
    hidden_states: list[torch.Tensor] | None  # L + 1 tensors (B, T, H), embeddings first


def init_weights(module: nn.Module, std: float) -> None:
    """BERT's init: normal(0, initializer_range) weights, zero biases, LayerNorm 1/0."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, std)
            if m.padding_idx is not None:
                nn.init.zeros_(m.weight[m.padding_idx])
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def extended_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 padding mask -> (B, 1, 1, T) boolean, True where a key may be attended.
    None (no padding) keeps SDPA on its fastest kernels."""
    if attention_mask is None:
        return None
    return attention_mask[:, None, None, :].bool()


class BertModel(nn.Module):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        init_weights(self, config.initializer_range)

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        output_hidden_states=False,
        last_rows=None,
    ) -> EncoderOutput:
        """`last_rows` (B, R) positions, first column 0 ([CLS], for the pooler): the last layer
        runs on those only and `last_hidden_state` is (B, R, H)."""
        x = self.embeddings(input_ids, token_type_ids)  # (B, T, H)
        mask = extended_attention_mask(attention_mask)  # (B, 1, 1, T) or None
        if self.config.is_decoder:
            T = x.size(1)
            left = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # (T, T)
            mask = left if mask is None else mask & left  # (B, 1, T, T)
        x, hidden_states = self.encoder(x, mask, output_hidden_states, last_rows)
        pooled = self.pooler(x) if self.pooler is not None else None
        return EncoderOutput(x, pooled, hidden_states)


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.decoder.weight = word_embeddings.weight  # tied, as in BERT
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x):
        return F.linear(self.transform(x), self.decoder.weight, self.bias)  # (..., V)


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


@dataclass
class PreTrainingOutput:
    loss: torch.Tensor  # mlm_loss (+ nsp_loss when NSP labels are given)
    mlm_loss: torch.Tensor
    nsp_loss: torch.Tensor | None
    mlm_logits: torch.Tensor  # (P, V) at the picked positions only
    mlm_labels: torch.Tensor  # (P,) the original ids there
    nsp_logits: torch.Tensor | None  # (B, 2)


def query_rows(picked: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) picked positions -> (B, R) rows: [CLS] (position 0), then the picked positions
    in order, padded with 0 to the longest row; and the (B, R) bool of the real ones."""
    keep = picked.clone()
    keep[:, 0] = True  # [CLS] feeds the pooler
    counts = keep.sum(1)  # (B,)
    R = int(counts.max())
    rows = torch.sort(keep.int(), dim=1, descending=True, stable=True).indices[:, :R]  # (B, R)
    valid = torch.arange(R, device=picked.device) < counts[:, None]  # (B, R)
    return torch.where(valid, rows, 0), valid


class BertForPreTraining(nn.Module):
    """BERT with the MLM and NSP heads.

    The MLM head runs on the picked positions only (labels != -100): the loss is the same as
    running it on every position, and the vocabulary projection, the largest matmul of a small
    model, shrinks by the masking rate (15% -> about 6.7x less work there). For the same reason
    the last encoder layer computes only the rows the heads read (picked positions and [CLS]),
    its keys and values still coming from every token.
    """

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        # the decoder shares word_embeddings, already initialised by BertModel
        for m in (self.cls.predictions.transform, self.cls.seq_relationship):
            init_weights(m, config.initializer_range)

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        labels=None,
        next_sentence_label=None,
    ) -> PreTrainingOutput:
        if labels is None:
            labels = torch.full_like(input_ids, -100)
        rows, valid = query_rows(labels != -100)  # (B, R)
        out = self.bert(input_ids, token_type_ids, attention_mask, last_rows=rows)
        row_labels = labels.gather(1, rows)  # (B, R)
        picked = (row_labels != -100) & valid  # (B, R), in position order as labels != -100
        h = out.last_hidden_state[picked]  # (P, H)
        mlm_labels = row_labels[picked]  # (P,)
        mlm_logits = self.cls.predictions(h)  # (P, V)
        # nothing picked (mlm_probability=0): a zero loss that still belongs to the graph
        mlm_loss = (
            F.cross_entropy(mlm_logits.float(), mlm_labels)
            if mlm_labels.numel()
            else mlm_logits.sum() * 0.0
        )
        nsp_logits = nsp_loss = None
        if next_sentence_label is not None:
            nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label)
        loss = mlm_loss if nsp_loss is None else mlm_loss + nsp_loss
        return PreTrainingOutput(loss, mlm_loss, nsp_loss, mlm_logits, mlm_labels, nsp_logits)
