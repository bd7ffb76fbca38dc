"""What a run does to the weights it starts from, before they load: a teacher's layers for a
DistilBERT student (`with_layers`), a fine-tuned model moved back towards its start
(`interpolated`, WiSE-FT), a vocabulary grown by new words (`with_new_words`), a narrow
student's embeddings from its teacher (`with_principal_embeddings`), and the one load of a
`Checkpoint`'s tensors into a model (`load_weights`; `load_start` for a run's start). Each takes
a `Checkpoint` (checkpoint.py reads them) and gives another, in the same key space (interop.py's
key map); none reads or writes a file."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import torch
from tokenizers import Tokenizer

from bert_lightning.checkpoint import Checkpoint
from bert_lightning.errors import UserError
from bert_lightning.interop import DECODER, WORD_EMBEDDINGS, load_into
from bert_lightning.model import BertConfig
from bert_lightning.model.distill import principal_embeddings

VOCAB_ROWS = (WORD_EMBEDDINGS, "cls.predictions.bias")  # one row an id

log = logging.getLogger(__name__)


def parts(keys) -> list[str]:
    """The modules a set of state-dict keys belongs to, for a log line: `bert.encoder`,
    `cls.predictions`, `generator`, ..."""
    return sorted(
        {".".join(k.split(".")[: 2 if k.startswith(("bert.", "cls.")) else 1]) for k in keys}
    )


# the parts (state-dict prefixes) of a checkpoint a model takes
PRETRAINED = ("bert.", "cls.")  # the encoder and its pretraining heads, not a task's
ENCODER = ("bert.",)  # the encoder alone: a task's model or an embedder starts from it
WHOLE = ("",)  # every tensor: a fine-tuned model as it was saved
POOLER = "bert.pooler."


def load_weights(model: torch.nn.Module, ckpt: Checkpoint, parts=PRETRAINED) -> list[str]:
    """`ckpt`'s tensors under `parts` into `model`, which must have a place for each, of its
    shape (`load_into` refuses the others); a pooler `model` was built without (an embedder,
    RTD's encoder) is left out. What a model takes from a checkpoint is decided here only.
    Returns the keys loaded."""
    pooler = any(k.startswith(POOLER) for k in model.state_dict())
    state = {
        k: v
        for k, v in ckpt.state_dict.items()
        if k.startswith(parts) and (pooler or not k.startswith(POOLER))
    }
    load_into(model, state)
    return sorted(state)


def load_start(model: torch.nn.Module, ckpt: Checkpoint) -> None:
    """The weights a run starts from (`init_from=`): each part of `ckpt` (`bert.encoder`,
    `cls.predictions`, ...) that `model` has too, heads included (HF `cls.predictions.*`,
    `cls.seq_relationship.*`, ours); what it lacks stays new, a part `model` has not (a task
    head, a pooler that RTD's encoder has not) is left out; the log says which."""
    own = model.state_dict()
    loaded = load_weights(model, ckpt, tuple(f"{p}." for p in parts(own)))
    said = {
        "new": parts(set(own) - set(loaded) - {DECODER}),
        "not used": parts(set(ckpt.state_dict) - set(loaded)),
    }
    rest = "".join(f"; {what} {keys}" for what, keys in said.items() if keys)
    log.info("starting from %s: loaded %s%s", ckpt.source, parts(loaded) or "nothing", rest)


def with_layers(ckpt: Checkpoint, layers: list[int]) -> Checkpoint:
    """`ckpt`'s model with only the encoder layers `layers` (in that order), its embeddings
    and heads as they are: DistilBERT's student, started from every other layer of its
    teacher."""
    L = ckpt.config.num_hidden_layers
    if not layers or len(set(layers)) < len(layers) or any(not 0 <= i < L for i in layers):
        raise UserError(
            f"layers {list(layers)}; expected distinct indices of {ckpt.source}'s {L} layers"
        )
    renumber = {str(old): str(new) for new, old in enumerate(layers)}
    state = {}
    for key, value in ckpt.state_dict.items():
        m = re.match(r"(bert\.encoder\.layer\.)(\d+)(\..*)", key)
        if m is None:
            state[key] = value
        elif m[2] in renumber:
            state[m[1] + renumber[m[2]] + m[3]] = value
    config = replace(ckpt.config, num_hidden_layers=len(layers))
    return replace(
        ckpt, config=config, state_dict=state, source=f"{ckpt.source}, layers {list(layers)}"
    )


def interpolated(ft: Checkpoint, start: Checkpoint, alpha: float) -> Checkpoint:
    """WiSE-FT's weights (Wortsman et al. 2022): each encoder tensor of the fine-tuned `ft`
    moved back towards `start`'s, `(1 - alpha) * start + alpha * ft` (`torch.lerp`: exactly
    `start` at 0, exactly `ft` at 1); the task head (and a pooler the start lacked, which
    fine-tuning began from new) stays the fine-tuned one."""
    if not 0 <= alpha <= 1:
        raise UserError(f"alpha={alpha}; expected 0 <= alpha <= 1")
    state = {}
    for key, value in ft.state_dict.items():
        begin = start.state_dict.get(key) if key.startswith("bert.") else None
        new = not key.startswith("bert.") or key.startswith("bert.pooler.") and begin is None
        if not new and (begin is None or begin.shape != value.shape):
            there = "none" if begin is None else tuple(begin.shape)
            raise UserError(
                f"{start.source} is not where {ft.source} started: its {key} is {there}, "
                f"the fine-tuned one {tuple(value.shape)}"
            )
        state[key] = value if new else torch.lerp(begin.to(value.dtype), value, alpha)
    source = f"{ft.source} at alpha {alpha} from {start.source}"
    return replace(ft, state_dict=state, source=source)


def padded_vocab(n: int) -> int:
    """A vocabulary of `n` tokens as a model holds it: a multiple of 64 (fast matmuls)."""
    return -(-n // 64) * 64


def with_new_words(ckpt: Checkpoint, tok: Tokenizer, pieces: dict[str, list[int]]) -> Checkpoint:
    """`ckpt` for `tok`, its tokenizer with new words (`extend_wordpiece`): each new word's
    embedding row and MLM bias the mean of its pieces', the vocabulary padded to a multiple of
    64 with the mean row (ids no text has); the tied decoder a `.ckpt` holds, the same rows."""
    size = max(padded_vocab(tok.get_vocab_size()), ckpt.config.vocab_size)
    ids = [tok.token_to_id(w) for w in pieces]
    state = dict(ckpt.state_dict)
    for key in VOCAB_ROWS:
        if key not in state:
            continue
        old = state[key]  # (V, ...)
        pad = old.mean(0, keepdim=True).expand(size - len(old), *old.shape[1:])  # (size - V, ...)
        rows = torch.cat([old, pad])  # (size, ...)
        if ids:
            rows[ids] = torch.stack([old[p].mean(0) for p in pieces.values()])  # (N, ...)
        state[key] = rows
    if DECODER in state:
        state[DECODER] = state[WORD_EMBEDDINGS]
    config = replace(ckpt.config, vocab_size=size)
    source = f"{ckpt.source} with {len(ids)} new words"
    return replace(ckpt, config=config, state_dict=state, tokenizer=tok, source=source)


def with_principal_embeddings(ckpt: Checkpoint, config: BertConfig) -> Checkpoint:
    """The start of a random `config`-shaped student whose embeddings are `ckpt`'s on their
    principal directions (`model.distill.principal_embeddings`); position rows past the
    student's `max_position_embeddings` are left out."""
    state = principal_embeddings(ckpt.state_dict, config.hidden_size)
    key = "bert.embeddings.position_embeddings.weight"
    state[key] = state[key][: config.max_position_embeddings]  # (P, width)
    if len(state[key]) < config.max_position_embeddings:
        del state[key]
    source = f"{ckpt.source}'s embeddings on {config.hidden_size} principal directions"
    return replace(ckpt, config=config, state_dict=state, source=source)
