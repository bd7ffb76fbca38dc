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
    # Not in transformers.BertConfig, an init only: "sinusoidal" starts the learned position
    # embeddings at the Transformer's sines and cosines (at initializer_range's scale), which
    # relate every offset by one linear map, instead of unrelated random vectors
    position_embedding_init: str = "normal"  # normal | sinusoidal
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
        if self.position_embedding_init not in ("normal", "sinusoidal"):
            raise UserError(
                f"position_embedding_init={self.position_embedding_init!r}; "
                "expected normal or sinusoidal"
            )

    def to_dict(self) -> dict:
        return asdict(self)


ACT2FN = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class LayerNorm(nn.LayerNorm):
    """Under autocast, runs in the autocast dtype (statistics in fp32 inside the kernel) and
    returns it. CUDA's autocast runs layer_norm in fp32, so every LayerNorm would copy its
    input up and its output down again for the next matmul, and the residual stream would stay
    fp32; here it is low-precision end to end, as the matmuls it feeds."""

    def forward(self, x):
        device = x.device.type
        if not torch.is_autocast_enabled(device):
            return super().forward(x)
        with torch.autocast(device, enabled=False):
            w, b = self.weight.to(x.dtype), self.bias.to(x.dtype)  # (H,): CUDA wants x's dtype
            y = F.layer_norm(x, self.normalized_shape, w, b, self.eps)
        return y.to(torch.get_autocast_dtype(device))  # a cast only after the fp32 embeddings


@dataclass
class Unpadded:
    """Where the real tokens of a padded (B, T) batch sit in it. The encoder runs its Linears,
    LayerNorms, activations and dropout on those (N, H) tokens alone, so a padded batch pays
    for its padding only inside the attention product, laid out padded for it."""

    index: torch.Tensor  # (N,) the real tokens' positions in the flattened (B * T) batch
    B: int
    T: int

    @classmethod
    def of(cls, attention_mask: torch.Tensor) -> Unpadded:
        B, T = attention_mask.shape
        return cls(attention_mask.flatten().nonzero().squeeze(1), B, T)

    def unpad(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, ...) -> (N, ...)
        return x.flatten(0, 1).index_select(0, self.index)

    def pad(self, x: torch.Tensor) -> torch.Tensor:  # (N, ...) -> (B, T, ...), zeros at pads
        out = x.new_zeros(self.B * self.T, *x.shape[1:]).index_copy(0, self.index, x)
        return out.unflatten(0, (self.B, self.T))

    def slots(self, rows: torch.Tensor) -> torch.Tensor:
        """(B, R) positions of real tokens -> (B, R) their rows in the (N, ...) tensor."""
        slot = torch.zeros(self.B * self.T, dtype=torch.long, device=rows.device)
        slot[self.index] = torch.arange(self.index.numel(), device=rows.device)
        return slot.view(self.B, self.T).gather(1, rows)  # (B, R)


def gather_positions(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(B, T, ...) at (B, K) positions -> (B, K, ...): the rows the heads read (the collator's
    `mlm_positions`, the last layer's rows), by `gather`, a static shape."""
    index = positions.view(*positions.shape, *(1,) * (x.dim() - 2))  # (B, K, 1...)
    return x.gather(1, index.expand(*positions.shape, *x.shape[2:]))  # (B, K, ...)


def captured() -> bool:
    """Whether this forward is being captured into a graph (torch.compile, torch.export, the
    ONNX tracer): none of its shapes may then depend on the data's values."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing()


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(
            config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id
        )
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, input_ids, token_type_ids=None, unpadded: Unpadded | None = None, position_ids=None
    ):
        """(B, T, H), or (N, H) the real tokens alone with `unpadded`."""
        T = input_ids.size(1)
        if self.position_embeddings.num_embeddings < T:
            raise UserError(
                f"sequence length {T} exceeds max_position_embeddings "
                f"{self.position_embeddings.num_embeddings}"
            )
        x = self.word_embeddings(input_ids)  # (B, T, H)
        if position_ids is None:
            x = x + self.position_embeddings.weight[:T]  # (T, H) broadcast over B
        else:
            x = x + self.position_embeddings(position_ids)  # (B, T, H)
        if token_type_ids is None:
            x = x + self.token_type_embeddings.weight[0]
        else:
            x = x + self.token_type_embeddings(token_type_ids)
        if unpadded is not None:
            x = unpadded.unpad(x)  # (N, H)
        return self.dropout(self.LayerNorm(x))


class BertSelfAttention(nn.Module):
    """Query, key and value in one projection (`qkv`, rows in that order): one matmul instead
    of three. Hugging Face's `query`/`key`/`value` are its three row blocks, which the
    checkpoint key map (`interop`) splits and joins."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x, attn_mask=None, x_q=None, unpadded: Unpadded | None = None):
        """`x_q` (B, R, H): the rows that query, default all of `x`; keys and values always
        come from every token of `x`. With `unpadded`, `x` is (N, H), the real tokens alone:
        they are laid out padded for the attention product only."""
        H, nh = x.size(-1), self.num_heads
        pad = (lambda t: t) if unpadded is None else unpadded.pad
        if x_q is None:
            qkv = pad(self.qkv(x)).unflatten(-1, (3, nh, H // nh))  # (B, T, 3, nh, hs)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)  # 3 x (B, nh, T, hs)
        else:
            w, b = self.qkv.weight, self.qkv.bias
            kv = pad(F.linear(x, w[H:], b[H:])).unflatten(-1, (2, nh, H // nh))  # (B, T, 2, nh, hs)
            k, v = kv.permute(2, 0, 3, 1, 4)  # 2 x (B, nh, T, hs)
            q = F.linear(x_q, w[:H], b[:H])  # (B, R, H)
            q = q.unflatten(-1, (nh, H // nh)).transpose(1, 2)  # (B, nh, R, hs)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=self.dropout_p if self.training else 0.0
        )  # (B, nh, R, hs)
        y = y.transpose(1, 2).flatten(2)  # (B, R, H)
        return y if unpadded is None or x_q is not None else unpadded.unpad(y)  # or (N, H)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
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
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class BertLayer(nn.Module):
    """One block. Post-LN (BERT): x = LN(x + f(x)). Pre-LN: x = x + f(LN(x)), reusing the same
    LayerNorm modules so that parameter names stay those of HF BERT. With `rows` (B, R)
    positions, only those rows are computed (queries, FFN), attending to every token. With
    `unpadded`, `x` is (N, H), the real tokens alone, and `rows` index it."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.pre_ln = config.pre_layer_norm
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(self, x, attn_mask=None, rows=None, unpadded: Unpadded | None = None):
        att_out, ffn_out = self.attention.output, self.output

        def select(t):  # (B, T, H) or (N, H) -> (B, R, H)
            if rows is None:
                return t
            if unpadded is not None:
                return t[rows]
            return gather_positions(t, rows)

        if self.pre_ln:
            ln = att_out.LayerNorm(x)
            h = self.attention.self(ln, attn_mask, None if rows is None else select(ln), unpadded)
            x = select(x) + att_out.dropout(att_out.dense(h))
            h = self.intermediate(ffn_out.LayerNorm(x))
            return x + ffn_out.dropout(ffn_out.dense(h))
        q = None if rows is None else select(x)
        h = self.attention.self(x, attn_mask, q, unpadded)  # (B, R, H) or (N, H)
        x = att_out.LayerNorm(select(x) + att_out.dropout(att_out.dense(h)))
        h = self.intermediate(x)  # (B, T, I)
        return ffn_out.LayerNorm(x + ffn_out.dropout(ffn_out.dense(h)))


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        # pre-LN leaves the residual stream un-normalised: one LayerNorm closes it
        self.LayerNorm = (
            LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            if config.pre_layer_norm
            else None
        )

    def forward(
        self,
        x,
        attn_mask=None,
        output_hidden_states=False,
        last_rows=None,
        unpadded: Unpadded | None = None,
    ):
        """`last_rows` (B, R): the last layer computes only these positions. With `unpadded`,
        `x` is (N, H), the real tokens alone; what is returned is laid out padded again (pad
        positions zero), or (B, R, H) for `last_rows`."""

        def padded(t):  # (N, H) -> (B, T, H); (B, T, H) or the last rows' (B, R, H) as they are
            return unpadded.pad(t) if unpadded is not None and t.dim() == 2 else t

        hidden_states = [padded(x)] if output_hidden_states else None
        for i, layer in enumerate(self.layer):
            if i == len(self.layer) - 1 and last_rows is not None:
                rows = last_rows if unpadded is None else unpadded.slots(last_rows)
                x = layer(x, query_mask(attn_mask, last_rows), rows, unpadded)  # (B, R, H)
            else:
                x = layer(x, attn_mask, unpadded=unpadded)
            if output_hidden_states:
                hidden_states.append(padded(x))
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
            if output_hidden_states:
                hidden_states[-1] = padded(x)
        return padded(x), hidden_states


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


def sinusoids(positions: int, width: int) -> torch.Tensor:
    """(positions, width) the Transformer's position encoding: sin and cos of position x
    10000^(-2i/width), interleaved."""
    pos = torch.arange(positions, dtype=torch.float32)[:, None]  # (P, 1)
    freq = torch.exp(torch.arange(0, width, 2) * (-torch.log(torch.tensor(1e4)) / width))  # (W/2,)
    out = torch.zeros(positions, width)
    out[:, 0::2] = torch.sin(pos * freq)  # (P, W/2)
    out[:, 1::2] = torch.cos(pos * freq)[:, : width // 2]
    return out


def extended_attention_mask(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, T) 1/0 padding mask -> (B, 1, 1, T) boolean, True where a key may be attended.
    None (no padding) keeps SDPA on its fastest kernels."""
    if attention_mask is None:
        return None
    return attention_mask[:, None, None, :].bool()


def document_mask(position_ids: torch.Tensor, attention_mask: torch.Tensor | None):
    """(B, T) positions that restart at 0 where a document starts (several documents packed in
    one row) -> (B, 1, T, T) True where query and key are in the same document. Padding joins
    the last document, so no query row is left with no key at all."""
    starts = position_ids == 0  # (B, T)
    if attention_mask is not None:
        starts = starts & attention_mask.bool()
    doc = starts.cumsum(1)  # (B, T) which document of its row a token is in
    return (doc[:, :, None] == doc[:, None, :])[:, None]  # (B, 1, T, T)


class BertModel(nn.Module):
    def __init__(self, config: BertConfig, add_pooling_layer: bool = True):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config) if add_pooling_layer else None
        init_weights(self, config.initializer_range)
        if config.position_embedding_init == "sinusoidal":
            table = self.embeddings.position_embeddings.weight  # (P, H)
            with (
                torch.no_grad()
            ):  # root mean square 1/sqrt(2) (sin^2 + cos^2 = 1) -> initializer_range
                table.copy_(sinusoids(*table.shape) * config.initializer_range * 2**0.5)

    def forward(
        self,
        input_ids,
        token_type_ids=None,
        attention_mask=None,
        output_hidden_states=False,
        last_rows=None,
        position_ids=None,
        unpad=True,
    ) -> EncoderOutput:
        """`last_rows` (B, R) positions, first column 0 ([CLS], for the pooler): the last layer
        runs on those only and `last_hidden_state` is (B, R, H). `position_ids` (B, T), as
        Hugging Face's, except that where they restart at 0 a new document starts, and
        attention stays within each document (packed rows of several documents). `unpad`:
        see `attention_inputs`."""
        unpadded, mask = self.attention_inputs(input_ids, attention_mask, position_ids, unpad)
        x = self.embeddings(input_ids, token_type_ids, unpadded, position_ids)  # (B, T, H) | (N, H)
        x, hidden_states = self.encoder(x, mask, output_hidden_states, last_rows, unpadded)
        pooled = self.pooler(x) if self.pooler is not None else None
        return EncoderOutput(x, pooled, hidden_states)

    def attention_inputs(
        self, input_ids, attention_mask=None, position_ids=None, unpad=True
    ) -> tuple[Unpadded | None, torch.Tensor | None]:
        """Where the real tokens are (Unpadded; None: the padded path) and the attention mask
        the encoder's layers take: padding, documents (`position_ids`), causal (`is_decoder`).
        Shared with a second encoder on the same inputs (the RTD generator).
        A mask is the data's say that rows are padded (the collator's `padded`): it is not read
        to find out. Such a batch runs on its real tokens alone, unless `unpad=False` (the
        padded path, to compare) or the forward is `captured()`: unpadding reads the count of
        real tokens, the one size a padded batch cannot know ahead, so a compiled step or an
        ONNX graph runs padded batches padded."""
        unpadded = None
        if unpad and attention_mask is not None and not captured():
            unpadded = Unpadded.of(attention_mask)
        mask = extended_attention_mask(attention_mask)  # (B, 1, 1, T) or None
        if position_ids is not None:
            docs = document_mask(position_ids, attention_mask)  # (B, 1, T, T)
            mask = docs if mask is None else mask & docs
        if self.config.is_decoder:
            T = input_ids.size(1)
            left = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()  # (T, T)
            mask = left if mask is None else mask & left  # (B, 1, T, T)
        return unpadded, mask


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

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
    mlm_logits: torch.Tensor  # (B * K, V) at the `mlm_positions` only
    mlm_labels: torch.Tensor  # (B * K,) the original ids there, -100 past a row's picks
    nsp_logits: torch.Tensor | None  # (B, 2)


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (P, V) logits, the mean over the labels that are not -100 (zero, still
    in the graph, when there are none), in fp32. The count stays on the device."""
    total = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")
    return total / (labels != -100).sum().clamp(min=1)


class BertForPreTraining(nn.Module):
    """BERT with the MLM and NSP heads.

    The MLM head runs on the picked positions only (`mlm_positions`, K of them a row): the loss
    is the same as running it on every position, and the vocabulary projection, the largest
    matmul of a small model, shrinks by the masking rate (15% -> about 6.7x less work there).
    For the same reason the last encoder layer computes only the rows the heads read ([CLS]
    and the K positions), its keys and values still coming from every token. Every shape is
    fixed by the batch's (B, T, K): nothing is read back to the host, and a compiled step sees
    one graph.
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
        *,
        labels,
        mlm_positions,
        next_sentence_label=None,
        position_ids=None,
        unpad=True,
    ) -> PreTrainingOutput:
        """`labels` (B, T): the original ids at the picked positions, -100 elsewhere;
        `mlm_positions` (B, K): where the MLM head predicts, the collator's (data/masking.py
        `picked_positions`), never found here: K fixes the heads' shape."""
        rows = F.pad(mlm_positions, (1, 0))  # (B, 1 + K): [CLS] first, for the pooler
        out = self.bert(
            input_ids,
            token_type_ids,
            attention_mask,
            last_rows=rows,
            position_ids=position_ids,
            unpad=unpad,
        )
        h = out.last_hidden_state[:, 1:].flatten(0, 1)  # (B * K, H)
        mlm_labels = gather_positions(labels, mlm_positions).flatten()  # (B * K,), -100 past picks
        mlm_logits = self.cls.predictions(h)  # (B * K, V)
        mlm = mlm_loss(mlm_logits, mlm_labels)
        nsp_logits = nsp_loss = None
        if next_sentence_label is not None:
            nsp_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
            nsp_loss = F.cross_entropy(nsp_logits.float(), next_sentence_label)
        loss = mlm if nsp_loss is None else mlm + nsp_loss
        return PreTrainingOutput(loss, mlm, nsp_loss, mlm_logits, mlm_labels, nsp_logits)
