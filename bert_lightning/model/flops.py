"""Parameter counts and useful FLOPs in closed form: what MFU and the size table are computed
from, checked against the real modules in tests."""

from __future__ import annotations

from torch import nn

from bert_lightning.model.bert import BertConfig


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

    Counted: the encoder's dense layers, attention's two (T x T) products, the pooler and NSP
    head, and the MLM head on the `num_picked` positions only (what we run, not a dense head);
    the last layer's queries, attention output and FFN on `last_rows` rows (`query_rows`'s
    B x R; None: every token), its keys and values on every token. `tokens`: the real tokens
    of a padded batch (None: B x T), which alone the unpadded encoder's dense layers run on;
    the attention products stay B x T x T.
    Element-wise work (LayerNorm, GELU, softmax, dropout, embeddings) is left out, as in MFU.
    The backward pass costs twice the forward (gradients of inputs and of weights).
    """
    H, I, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    N = batch_size * seq_len  # positions
    D = N if tokens is None else tokens  # what the dense layers run on
    R = D if last_rows is None else last_rows

    def layer(rows: int, queries: int) -> int:  # Q, attention output, FFN on `rows`; K, V on
        # every real token; QK^T and PV for `queries` query positions over T keys
        return (
            2 * rows * (2 * H * H + 2 * H * I) + 2 * D * 2 * H * H + 2 * 2 * queries * seq_len * H
        )

    heads = 2 * batch_size * (H * H + 2 * H) + 2 * num_picked * (H * H + H * V)
    last = layer(R, N if last_rows is None else last_rows)
    forward = (L - 1) * layer(D, N) + last + heads
    return 3 * forward if backward else forward
