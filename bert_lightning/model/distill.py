"""Knowledge distillation losses, in plain torch: what a student encoder learns from a frozen
teacher's outputs on the same tokens (`objective=distill`, training/distill_module.py).

- MiniLM (Wang et al. 2020): KL between the last layer's self-attention distributions, and
  between its value-value relations. Both models' queries, keys and values are re-split into
  one number of relation heads (MiniLMv2), so the widths and head counts may differ; with the
  models' own head count the first is exactly the attention they compute.
- TinyBERT (Jiao et al. 2020): mean squared error between the hidden states of mapped layers,
  the student's through a learned projection to the teacher's width.
- Sentence embeddings: one minus the cosine of the mean-pooled last hidden states.
- DistilBERT (Sanh et al. 2019): KL to the teacher's MLM distribution at the masked positions,
  both softened by a temperature (scaled by its square, as Hinton et al.).

And a start for a student narrower than its teacher: the teacher's embeddings on their
principal directions (`principal_embeddings`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from bert_lightning.errors import UserError
from bert_lightning.model.bert import BertModel
from bert_lightning.model.heads import pool_tokens

# the losses that read the last layer's output; MiniLM's (attention, value_relation) read only
# its input, and then the last layer runs on [CLS] alone
READS_LAST = ("hidden", "embedding", "soft_mlm", "mlm")
# the losses on the MLM head: they read the masked text, at the picked positions; the others
# read the original text
MASKED = ("soft_mlm", "mlm")


def reads_last(weights: dict[str, float]) -> bool:
    """Whether a loss of these weights reads the last hidden states (`READS_LAST`)."""
    return any(weights[k] for k in READS_LAST)


def reads_masked(weights: dict[str, float]) -> bool:
    """Whether a loss of these weights runs the MLM head on the masked text (`MASKED`)."""
    return any(weights[k] for k in MASKED)


def last_layer_qkv(bert: BertModel, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The last layer's queries, keys and values (3 x (B, T, H)) from its input `x` (B, T, H),
    `hidden_states[-2]`: the one projection the layer itself runs, recomputed on the padded
    layout (SDPA does not hand out its attention weights)."""
    layer = bert.encoder.layer[-1]
    if layer.pre_ln:
        x = layer.attention.output.LayerNorm(x)
    return layer.attention.self.qkv(x).chunk(3, dim=-1)  # rows q, k, v


def relation_logits(a: torch.Tensor, b: torch.Tensor, heads: int, mask) -> torch.Tensor:
    """(B, T, H) x (B, T, H) -> (B, heads, T, T) scaled dot products of `heads` re-split heads,
    keys outside `mask` (the encoder's boolean attention mask, broadcastable) at the lowest
    float: a softmax gives them 0 and KL terms there stay 0, not NaN."""
    H = a.size(-1)
    if H % heads:
        raise UserError(f"objective.relation_heads={heads} does not divide a width of {H}")

    def split(x):  # (B, T, H) -> (B, heads, T, H / heads)
        return x.float().unflatten(-1, (heads, H // heads)).transpose(1, 2)

    with torch.autocast(a.device.type, enabled=False):  # a KL of bf16 logits is coarse
        s = split(a) @ split(b).transpose(-1, -2) / math.sqrt(H // heads)  # (B, heads, T, T)
    return s if mask is None else s.masked_fill(~mask, torch.finfo(s.dtype).min)


def masked_mean(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The mean of `x` where `keep` (a bool broadcastable to it), by weights and not by a
    boolean selection, whose size the host would wait for."""
    keep = keep.expand_as(x)
    return torch.where(keep, x, 0).sum() / keep.sum().clamp(min=1)


def relation_kl(teacher: torch.Tensor, student: torch.Tensor, queries: torch.Tensor):
    """KL(teacher || student) of each query row's distribution over keys, from (B, h, T, T)
    logits; the mean over heads and the real query positions (`queries` (B, T) bool)."""
    lt, ls = teacher.log_softmax(-1), student.log_softmax(-1)  # (B, h, T, T)
    kl = (lt.exp() * (lt - ls)).sum(-1)  # (B, h, T)
    return masked_mean(kl, queries[:, None])


def layer_map(student_layers: int, teacher_layers: int) -> list[tuple[int, int]]:
    """TinyBERT's uniform map of hidden states, embeddings (0) to embeddings: the student's
    m-th layer output learns the teacher's round(m x teacher_layers / student_layers)-th."""
    return [(m, round(m * teacher_layers / student_layers)) for m in range(student_layers + 1)]


def hidden_mse(student, teacher, project, pairs, tokens: torch.Tensor) -> torch.Tensor:
    """Mean over the mapped `pairs` of the squared error between `project`ed student and
    teacher hidden states ((B, T, H) each), averaged over real tokens (`tokens` (B, T) bool)
    and the teacher's width."""
    errors = [
        masked_mean((project(student[s]).float() - teacher[t].float()).square(), tokens[..., None])
        for s, t in pairs
    ]  # each over (B, T, Ht)
    return torch.stack(errors).mean()


def mean_pool(h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(B, T, H) -> (B, H) the mean over each row's real tokens (`tokens` (B, T) bool): the
    embedding loss pools as the sequence head and `embed` do."""
    return pool_tokens(h, tokens, "mean")  # (B, H)


def embedding_cosine(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """1 - cos of (B, H) embeddings, the mean over the batch."""
    return 1 - F.cosine_similarity(student.float(), teacher.float(), dim=-1).mean()


def soft_mlm(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float, picked: torch.Tensor
) -> torch.Tensor:
    """KL(teacher || student) of (P, V) logits softened by `temperature`, the mean over the
    `picked` (P,) positions, times temperature^2 (the gradients' scale then does not depend
    on it)."""
    lt = (teacher.float() / temperature).log_softmax(-1)
    ls = (student.float() / temperature).log_softmax(-1)
    kl = F.kl_div(ls, lt, log_target=True, reduction="none").sum(-1)  # (P,)
    return masked_mean(kl, picked) * temperature**2


EMBEDDINGS = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def principal_embeddings(teacher: dict[str, torch.Tensor], width: int) -> dict[str, torch.Tensor]:
    """The teacher's word, position and token-type embedding tables (`bert.embeddings.*`,
    (rows, H)) -> (rows, width) on the `width` principal directions of its word embeddings: one
    projection for all three, so that their sum projects as they do. Most of a small student is
    its embedding table; started so, every token has its place in the teacher's space."""
    word = teacher["bert.embeddings.word_embeddings.weight"].float()  # (V, H)
    if not 0 < width <= word.size(1):
        raise UserError(
            f"objective.embeddings_from_teacher: the student's width {width} must be at most "
            f"the teacher's {word.size(1)}"
        )
    _, _, vh = torch.linalg.svd(word - word.mean(0), full_matrices=False)  # vh (H, H)
    basis = vh[:width].T  # (H, width)
    keys = [f"bert.embeddings.{name}.weight" for name in EMBEDDINGS]
    return {k: teacher[k].float() @ basis for k in keys}  # (rows, width) each
