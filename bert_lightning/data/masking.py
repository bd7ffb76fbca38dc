"""MLM masking and batch collation.

Masks are drawn in the collator, so every epoch sees a fresh mask of the same text (dynamic
masking, as RoBERTa and MosaicBERT do), at the cost of a few vectorised torch ops per batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tokenizers import Tokenizer

from bert_lightning.data.tokenizer import special_ids
from bert_lightning.errors import UserError


@dataclass(frozen=True, kw_only=True)
class MaskingConfig:
    """`data.masking`; its values live in the config (conf/data/_corpus.yaml)."""

    mlm_probability: float  # share of real tokens picked for prediction
    p_mask: float  # of the picked: replaced by [MASK]
    p_random: float  # of the picked: replaced by a random non-special token (rest kept)
    # pick whole words: each word (a piece and its `##` continuations) is picked with
    # probability mlm_probability, all its pieces together; the rate applies to words, so the
    # share of picked tokens comes out a little higher (long words have more pieces)
    whole_word: bool

    def __post_init__(self):
        for name in ("mlm_probability", "p_mask", "p_random"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise UserError(f"masking.{name}={getattr(self, name)}; expected 0..1")
        if self.p_mask + self.p_random > 1.0:
            raise UserError(f"masking.p_mask + p_random = {self.p_mask + self.p_random} > 1")


def max_predictions(masking: MaskingConfig, length: int) -> int:
    """The most positions a row of `length` tokens has picked, K of the (B, K) positions the
    model's heads gather: fixed by the length, so a compiled step sees one shape (NVIDIA's BERT
    `max_predictions_per_seq`: 20 at 128 tokens and 15%). Whole words may overshoot a row's
    count by a word: twice the room, and a cap."""
    k = math.ceil(masking.mlm_probability * length)
    return min(length, 2 * k if masking.whole_word else k)


def picked_positions(labels: torch.Tensor, K: int | None = None) -> torch.Tensor:
    """(B, T) labels (-100: not picked) -> (B, K) each row's picked positions in order, then
    its unpicked ones (labels -100 there): a fixed number of rows for the model's heads,
    whatever a row's count, read by `gather` and not by a boolean selection, whose size the
    host would have to wait for. K at least the most picks of a row (the collator's
    `max_predictions`); None: T, room for every position, for labels masked outside the
    collator (tests, benches, inference)."""
    picked = (labels != -100).int()  # (B, T)
    order = torch.sort(picked, dim=1, descending=True, stable=True).indices  # (B, T)
    return order if K is None else order[:, :K]  # (B, K)


def mask_tokens(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    mask_id: int,
    random_ids: torch.Tensor,
    cfg: MaskingConfig,
    generator: torch.Generator | None = None,
    word_starts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) ids and a (B, T) bool of pickable positions -> masked ids and labels (-100 where
    not picked). A row of n pickable tokens has p x n of them picked, uniformly at random, as
    BERT's reference (`num_to_predict`); p x n is rounded up or down at random, so the share is
    p in expectation at every length, and a row never has more than `max_predictions` picks.
    With `word_starts` (B, T) bool, p x (its words) whole words are picked, in a random order
    until the next would pass `max_predictions`; what a picked token becomes ([MASK], random,
    kept) is still drawn per token, as in BERT's reference whole-word masking. `random_ids`
    lists the ids a random replacement is drawn from."""
    B, T = input_ids.shape
    u = torch.rand(input_ids.shape, generator=generator)  # (B, T) the order of picking
    units = maskable
    if word_starts is not None:
        word = torch.cumsum(word_starts, dim=1)  # (B, T) word number of each token, from 1
        u = torch.cat([u[:, :1], u], dim=1).gather(1, word)  # (B, T) each word's one draw
        units = word_starts & maskable
    quota = (cfg.mlm_probability * units.sum(1) + torch.rand(B, generator=generator)).floor()
    key = torch.where(maskable, u, 2.0)  # (B, T) the unpickable last
    order = key.argsort(dim=1, stable=True)  # (B, T) positions in picking order, words whole
    place = torch.empty_like(order).scatter_(1, order, torch.arange(T).expand(B, T))  # (B, T)
    if word_starts is None:
        picked = maskable & (place < quota[:, None])
    else:  # a word's place among words, and where its last piece comes in picking order
        nth = (units.gather(1, order).cumsum(1) - 1).gather(1, place)  # (B, T)
        end = torch.full((B, T + 1), -1).scatter_reduce(
            1, word, torch.where(maskable, place, -1), "amax"
        )  # (B, words + 1)
        fits = end.gather(1, word) < max_predictions(cfg, T)  # (B, T)
        picked = maskable & (nth < quota[:, None]) & fits
    labels = torch.where(picked, input_ids, -100)
    v = torch.rand(input_ids.shape, generator=generator)  # (B, T) what a pick becomes
    to_mask = picked & (v < cfg.p_mask)
    to_random = picked & (v >= cfg.p_mask) & (v < cfg.p_mask + cfg.p_random)
    draws = torch.randint(len(random_ids), input_ids.shape, generator=generator)  # (B, T)
    out = torch.where(to_mask, mask_id, input_ids)
    out = torch.where(to_random, random_ids[draws], out)
    return out, labels


class MLMCollator:
    """Pads a list of examples to the longest and masks them.

    Examples are dicts with `input_ids` (framed with [CLS]/[SEP]) and optionally
    `token_type_ids` and `next_sentence_label` (NSP pairs); an example that already has
    `labels` (a validation set masked once, so its loss is comparable across evaluations) is
    padded, not masked again.
    `attention_mask` is returned where the data pad their rows (`padded`: rows of one document
    or pair), whether or not a batch happens to need it, so that the model decides how to run
    by the data option and not by reading the mask; packed blocks, all of one length, have
    none. With `cls_id`, `position_ids` restart at each [CLS]: the model keeps attention within
    the documents they mark (`packed_isolated`).
    `mlm_positions` (B, K): each row's picked positions in order, then unpicked ones, K fixed
    by the length (`max_predictions`): the static shape the heads gather.
    """

    def __init__(
        self,
        pad_id: int,
        mask_id: int,
        special_ids: Sequence[int],
        vocab_size: int,
        masking: MaskingConfig,
        continuation_ids: Sequence[int] = (),
        cls_id: int | None = None,
        padded: bool = True,
    ):
        self.pad_id, self.mask_id, self.cls_id, self.padded = pad_id, mask_id, cls_id, padded
        self.special_ids = torch.tensor(sorted(set(special_ids)))
        keep = torch.ones(vocab_size, dtype=torch.bool)
        keep[self.special_ids] = False
        self.random_ids = keep.nonzero().squeeze(1)  # (V - n_special,)
        self.masking = masking
        if self.masking.whole_word and not len(continuation_ids):
            raise UserError("masking.whole_word needs the ids of the `##` continuation pieces")
        self.continuation = torch.zeros(vocab_size, dtype=torch.bool)  # (V,) `##` pieces
        self.continuation[list(continuation_ids)] = True

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer: Tokenizer,
        masking: MaskingConfig,
        isolate: bool = False,
        padded: bool = True,
    ):
        """`isolate`: documents packed in one example attend within themselves alone;
        `padded`: examples differ in length (not packed blocks)."""
        ids = special_ids(tokenizer)
        return cls(
            pad_id=ids["[PAD]"],
            mask_id=ids["[MASK]"],
            special_ids=list(ids.values()),
            vocab_size=tokenizer.get_vocab_size(),
            masking=masking,
            continuation_ids=[i for t, i in tokenizer.get_vocab().items() if t[:2] == "##"],
            cls_id=ids["[CLS]"] if isolate else None,
            padded=padded,
        )

    def maskable(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Real, non-special tokens (padding is [PAD], a special token)."""
        return ~torch.isin(input_ids, self.special_ids)

    def mask(self, input_ids: torch.Tensor, generator: torch.Generator | None = None):
        maskable = self.maskable(input_ids)
        starts = None
        if self.masking.whole_word:  # a word starts at a real token that is not a `##` piece,
            # or at a `##` piece cut from its word (first after [CLS]/[SEP])
            after_special = torch.ones_like(maskable)  # (B, T)
            after_special[:, 1:] = ~maskable[:, :-1]
            starts = maskable & (~self.continuation[input_ids] | after_special)  # (B, T)
        return mask_tokens(
            input_ids, maskable, self.mask_id, self.random_ids, self.masking, generator, starts
        )

    def __call__(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        lengths = [len(e["input_ids"]) for e in examples]
        T = max(lengths)
        batch = {"input_ids": _pad([e["input_ids"] for e in examples], T, self.pad_id)}  # (B, T)
        if self.cls_id is not None:
            batch["position_ids"] = document_positions(batch["input_ids"] == self.cls_id)
        if "token_type_ids" in examples[0]:
            batch["token_type_ids"] = _pad([e["token_type_ids"] for e in examples], T, 0)
        if "next_sentence_label" in examples[0]:
            batch["next_sentence_label"] = torch.tensor(
                [e["next_sentence_label"] for e in examples]
            )  # (B,)
        if "labels" in examples[0]:
            batch["labels"] = _pad([e["labels"] for e in examples], T, -100)
        else:  # a batch's own seed (see data/sampling.py) makes its mask reproducible
            seed = examples[0].get("mask_seed")
            g = torch.Generator().manual_seed(seed) if seed is not None else None
            batch["input_ids"], batch["labels"] = self.mask(batch["input_ids"], g)
        batch["mlm_positions"] = self.positions(batch["labels"])  # (B, K)
        if self.padded or min(lengths) < T:
            batch["attention_mask"] = (
                torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
            ).long()  # (B, T)
        return batch

    def positions(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, T) labels -> (B, K) `picked_positions`, K = `max_predictions` of the length.
        Examples masked elsewhere with more picks than that are refused: the heads would
        silently skip some."""
        K = max_predictions(self.masking, labels.size(1))
        most = int((labels != -100).sum(1).max())
        if most > K:
            raise UserError(
                f"an example has {most} picked positions of {labels.size(1)}; masking "
                f"(mlm_probability={self.masking.mlm_probability}) allows at most {K}"
            )
        return picked_positions(labels, K)


def document_positions(starts: torch.Tensor) -> torch.Tensor:
    """(B, T) True where a document starts ([CLS]) -> (B, T) positions that restart there, as
    at the start of each row (a document continued from the previous block)."""
    t = torch.arange(starts.size(1)).expand_as(starts)  # (B, T)
    start = torch.where(starts, t, 0).cummax(1).values  # (B, T) where each token's document began
    return t - start


def _pad(rows: list, length: int, value: int) -> torch.Tensor:
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row)
    return out
