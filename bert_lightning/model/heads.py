"""Task heads on the encoder, in plain torch, named as Hugging Face names them (`bert`,
`dropout`, `classifier`), so a fine-tuned state dict is a `BertForSequenceClassification` /
`BertForTokenClassification` one by key."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bert_lightning.choices import POOLINGS
from bert_lightning.errors import UserError
from bert_lightning.model.bert import BertConfig, BertModel, init_weights

HEAD_POOLINGS = ("cls", "mean", "max")
# sentence-transformers' models are mean-pooled: the zero-shot cosine's pooling, and a
# bi-encoder's unless a task says otherwise (it then starts from the zero-shot ranking)
ZERO_SHOT_POOLING = "mean"


def pool_tokens(h: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """(B, T, H) -> (B, H): the mean or the max over the real tokens (padding excluded)."""
    real = attention_mask.bool()[..., None]  # (B, T, 1)
    if pooling == "mean":
        return (h * real).sum(1) / real.sum(1).clamp(min=1)  # (B, H)
    if pooling == "max":
        return h.masked_fill(~real, float("-inf")).amax(1)  # (B, H)
    raise UserError(f"pooling={pooling!r}; expected mean or max")


def pool(hidden: list[torch.Tensor], mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """hidden: L + 1 tensors (B, T, H) (embeddings, then each layer); mask (B, T) -> one row
    per sequence, by `POOLINGS`."""
    if pooling == "cls":
        return hidden[-1][:, 0]  # (B, H)
    if pooling in ("mean", "max"):
        return pool_tokens(hidden[-1], mask, pooling)  # (B, H)
    if pooling == "last4":
        if len(hidden) < 5:
            raise UserError(f"pooling=last4 needs 4 layers; the model has {len(hidden) - 1}")
        return torch.cat([h[:, 0] for h in hidden[-4:]], dim=-1)  # (B, 4H)
    raise UserError(f"pooling={pooling!r}; expected one of {list(POOLINGS)}")


class BertForSequenceClassification(nn.Module):
    """One row of logits per sequence (num_labels=1: a score). `pooling="cls"` reads the pooled
    `[CLS]` as BERT (and HF's class) does; `mean` / `max` pool the last layer over the real
    tokens and carry no pooler: a sign that sits at one position (one wrong token) is read by
    the last layer's own row there, not through one more attention step from `[CLS]`."""

    def __init__(self, config: BertConfig, num_labels: int, pooling: str):
        super().__init__()
        if pooling not in HEAD_POOLINGS:
            raise UserError(f"task.pooling={pooling!r}; expected one of {HEAD_POOLINGS}")
        self.config, self.num_labels, self.pooling = config, num_labels, pooling
        self.bert = BertModel(config, add_pooling_layer=pooling == "cls")
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, unpad=True):
        """`unpad`: as `BertModel.attention_inputs`'s."""
        out = self.bert(input_ids, token_type_ids, attention_mask, unpad=unpad)
        if self.pooling == "cls":
            pooled = out.pooler_output  # (B, H)
        else:
            mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
            pooled = pool_tokens(out.last_hidden_state, mask, self.pooling)  # (B, H)
        return self.classifier(self.dropout(pooled))  # (B, num_labels)


class BertForTokenClassification(nn.Module):
    """Logits for every token; HF's token model has no pooler, nor does this one."""

    def __init__(self, config: BertConfig, num_labels: int):
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.bert = BertModel(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_weights(self.classifier, config.initializer_range)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, unpad=True):
        """`unpad`: as `BertModel.attention_inputs`'s."""
        out = self.bert(input_ids, token_type_ids, attention_mask, unpad=unpad)
        h = out.last_hidden_state  # (B, T, H)
        return self.classifier(self.dropout(h))  # (B, T, num_labels)


class BertBiEncoder(nn.Module):
    """A bi-encoder (as sentence-transformers' models): the query and the ad are encoded
    apart and the score's logit is `classifier(cos(u, v))`, u and v their pooled last layers.

    It reads the cross-encoder's input `[CLS] query [SEP] ad [SEP]` (token types 0 then 1) and
    splits it into `[CLS] query [SEP]` and `[CLS] ad [SEP]`, so the data path, the checkpoint and
    `bert-lightning score` are those of the cross-encoder. Before any training its score orders
    rows as the zero-shot cosine of the pretrained encoder does (`ZERO_SHOT_POOLING`):
    fine-tuning starts from it.
    `classifier` (1 -> 1) starts at 20 cos - 10 (sentence-transformers' scale of 20)."""

    def __init__(self, config: BertConfig, pooling: str):
        super().__init__()
        if pooling not in HEAD_POOLINGS:
            raise UserError(f"task.pooling={pooling!r}; expected one of {HEAD_POOLINGS}")
        self.config, self.num_labels, self.pooling = config, 1, pooling
        self.bert = BertModel(config, add_pooling_layer=pooling == "cls")
        self.classifier = nn.Linear(1, 1)
        with torch.no_grad():
            self.classifier.weight.fill_(20.0)
            self.classifier.bias.fill_(-10.0)

    def embed(self, ids: torch.Tensor, mask: torch.Tensor, unpad=True) -> torch.Tensor:
        """`unpad`: as `BertModel.attention_inputs`'s."""
        out = self.bert(ids, torch.zeros_like(ids), mask, unpad=unpad)
        if self.pooling == "cls":
            return out.pooler_output  # (B, H)
        return pool_tokens(out.last_hidden_state, mask, self.pooling)  # (B, H)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, unpad=True):
        return self.score(*self.pair_embeddings(input_ids, token_type_ids, attention_mask, unpad))

    def score(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, 1) logits of pooled queries `u` and ads `v` (B, H)."""
        cos = F.cosine_similarity(u.float(), v.float(), dim=-1)  # (B,)
        return self.classifier(cos[:, None].to(self.classifier.weight.dtype))  # (B, 1)

    def pair_embeddings(self, input_ids, token_type_ids=None, attention_mask=None, unpad=True):
        """(u, v), (B, H) each: the pooled query and ad of `[CLS] query [SEP] ad [SEP]` rows
        (what an in-batch contrastive loss compares across rows)."""

        def embed(ids, mask):  # (B, T) each -> (B, H)
            return self.embed(ids, mask, unpad)

        return pair_embeddings(embed, input_ids, token_type_ids, attention_mask)

    def cosine(self, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
        """(B,) cosine of the pooled query and ad of `[CLS] query [SEP] ad [SEP]` rows."""
        return pair_cosine(self.embed, input_ids, token_type_ids, attention_mask)


def pair_cosine(embed, input_ids, token_type_ids=None, attention_mask=None) -> torch.Tensor:
    """(B,) cosine of the query and the ad of each row (`pair_embeddings`): a bi-encoder's, in
    torch or exported."""
    u, v = pair_embeddings(embed, input_ids, token_type_ids, attention_mask)  # (B, H) each
    return F.cosine_similarity(u.float(), v.float(), dim=-1)  # (B,)


def pair_embeddings(embed, input_ids, token_type_ids=None, attention_mask=None):
    """(u, v), (B, H) each: the query and the ad of `[CLS] query [SEP] ad [SEP]` rows (token
    types 0 then 1), each read alone as `[CLS] query [SEP]` and `[CLS] ad [SEP]` by
    `embed(ids, mask)` -> (B, H)."""
    if token_type_ids is None:
        raise ValueError("a bi-encoder needs token_type_ids: 0 on the query, 1 on the ad")
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    first = (mask.bool() & (token_type_ids == 0)).sum(1)  # (B,) [CLS] query [SEP]
    second = (mask.bool() & (token_type_ids == 1)).sum(1)  # (B,) ad [SEP]
    Tq, Ta = int(first.max()), int(second.max())
    q_ids, q_mask = input_ids[:, :Tq], mask[:, :Tq] * (token_type_ids[:, :Tq] == 0)
    pos = (first[:, None] + torch.arange(Ta, device=input_ids.device)).clamp(
        max=input_ids.size(1) - 1
    )  # (B, Ta)
    a_ids = torch.cat([input_ids[:, :1], input_ids.gather(1, pos)], 1)  # (B, 1 + Ta)
    a_mask = torch.cat(
        [mask[:, :1], (torch.arange(Ta, device=mask.device) < second[:, None]).long()], 1
    )  # (B, 1 + Ta)
    return embed(q_ids, q_mask), embed(a_ids, a_mask)  # (B, H) each
