"""Next-sentence-prediction pairs, after the BERT reference recipe (`create_pretraining_data.py`
of google-research/bert): `[CLS] A [SEP] B [SEP]`, B the true continuation of A or, half of the
time, a run of sentences from another document.

Sentences come from `pysbd`, a rule-based splitter that ships its rules (no model download, so it
runs offline) and handles abbreviations, initials and decimals ("Nov. 8", "U.S. District",
"$3.50") that a regex splits wrongly; C4 keeps one paragraph per line, and each line is split.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache, partial

import datasets
from tokenizers import Tokenizer

from bert_lightning.data.pipeline import map_procs
from bert_lightning.data.pretraining import PretrainDataModule
from bert_lightning.data.tokenizer import batch_encode, special_ids
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import fingerprint

Document = Sequence[Sequence[int]]  # token ids of each sentence


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def split_sentences(text: str) -> list[str]:
    """A document -> its sentences: lines (C4 paragraphs) split by pysbd, blanks dropped."""
    seg = _segmenter()
    return [s.strip() for line in text.splitlines() if line.strip() for s in seg.segment(line)]


def truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    """Trim the longer of A and B, one token at a time from a random end, until they fit."""
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def document_pairs(
    documents: Sequence[Document],
    doc_index: int,
    max_seq_length: int,
    short_seq_prob: float,
    rng: random.Random,
) -> list[tuple[list[int], list[int], int, int]]:
    """The pairs of one document: (A, B, label, index of B's document); label 0 = IsNext,
    1 = NotNext (the `transformers` convention). `documents` is the whole pool that random Bs
    are drawn from; it needs `len` and indexing only (an Arrow column serves).

    One change to the reference: it forces NotNext whenever A's chunk is a single sentence,
    which pulls the IsNext share far below one half on short targets. Here the coin is always
    fair: an IsNext chunk of one sentence takes the next sentence as B, and a lone last
    sentence, which has no continuation, makes no pair (for either label, so the coin stays
    fair)."""
    document = documents[doc_index]
    max_tokens = max_seq_length - 3  # [CLS], [SEP], [SEP]
    # a share of shorter sequences, so that the model also sees the short inputs of fine-tuning
    target = rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens
    pairs = []
    chunk: list[Sequence[int]] = []
    length, i = 0, 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i])
        if i == len(document) - 1 or length >= target:
            if len(chunk) == 1 and i == len(document) - 1:
                break  # a lone last sentence has no continuation: no pair (see above)
            is_random = rng.random() < 0.5
            if len(chunk) == 1 and not is_random:
                i += 1  # a continuation needs a second sentence: take the next one
                chunk.append(document[i])
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = [t for s in chunk[:a_end] for t in s]
            if is_random:
                label = 1
                b_doc = rng.randrange(len(documents) - 1)
                b_doc += b_doc >= doc_index  # any document but this one
                other = documents[b_doc]
                b: list[int] = []
                for s in other[rng.randint(0, len(other) - 1) :]:
                    b.extend(s)
                    if len(b) >= target - len(a):
                        break
                i -= len(chunk) - a_end  # the unused sentences start the next chunk
            else:
                label, b_doc = 0, doc_index
                b = [t for s in chunk[a_end:] for t in s]
            truncate_pair(a, b, max_tokens, rng)
            if a and b:
                pairs.append((a, b, label, b_doc))
            chunk, length = [], 0
        i += 1
    return pairs


def frame_pair(a: list[int], b: list[int], cls_id: int, sep_id: int) -> tuple[list, list]:
    """`[CLS] A [SEP] B [SEP]` and its segment ids: 0 up to the first [SEP], 1 after."""
    return [cls_id, *a, sep_id, *b, sep_id], [0] * (len(a) + 2) + [1] * (len(b) + 1)


def _tokenize_sentences(batch, tokenizer: Tokenizer):
    sentences = [split_sentences(text) for text in batch["text"]]
    flat = batch_encode(tokenizer, [s for doc in sentences for s in doc])
    out, k = [], 0
    for doc in sentences:
        out.append([ids for ids in flat[k : k + len(doc)] if ids])
        k += len(doc)
    return {"sentences": out}


def _pairs(batch, indices, documents, cls_id, sep_id, max_seq_length, short_seq_prob, seed, dupe):
    ids, types, labels = [], [], []
    for d in range(dupe):
        # seeded by position, so the pairs do not depend on map batch size or process count
        for doc_index in indices:
            rng = random.Random(f"{seed}/{d}/{doc_index}")
            for a, b, label, _ in document_pairs(
                documents, doc_index, max_seq_length, short_seq_prob, rng
            ):
                x, t = frame_pair(a, b, cls_id, sep_id)
                ids.append(x)
                types.append(t)
                labels.append(label)
    return {"input_ids": ids, "token_type_ids": types, "next_sentence_label": labels}


def tokenize_sentences(
    docs: datasets.Dataset, tokenizer: Tokenizer, num_proc: int | None = None
) -> datasets.Dataset:
    """`text` -> `sentences` (token ids of each), documents without any dropped."""
    return docs.map(
        _tokenize_sentences,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer},
        remove_columns=docs.column_names,
        num_proc=map_procs(docs, num_proc),
        new_fingerprint=fingerprint(docs._fingerprint, tokenizer.to_str(), "sentences"),
        desc="splitting sentences",
    ).filter(lambda row: len(row["sentences"]) > 0, desc="dropping empty documents")


def frame_pairs(
    sentences: datasets.Dataset,
    tokenizer: Tokenizer,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    seed: int,
    num_proc: int | None = None,
) -> datasets.Dataset:
    """The frame stage of NSP: documents' sentences -> `[CLS] A [SEP] B [SEP]` pairs with
    `token_type_ids` and `next_sentence_label`."""
    if len(sentences) < 2:
        raise UserError("NSP needs at least 2 documents with text (NotNext draws another)")
    ids = special_ids(tokenizer)
    params = (max_seq_length, short_seq_prob, seed, dupe_factor)
    return sentences.map(
        _pairs,
        batched=True,
        with_indices=True,
        remove_columns=["sentences"],
        fn_kwargs={
            "documents": sentences["sentences"],
            "cls_id": ids["[CLS]"],
            "sep_id": ids["[SEP]"],
            "max_seq_length": max_seq_length,
            "short_seq_prob": short_seq_prob,
            "seed": seed,
            "dupe": dupe_factor,
        },
        num_proc=map_procs(sentences, num_proc),
        new_fingerprint=fingerprint(sentences._fingerprint, *params, "pairs"),
        desc="making NSP pairs",
    )


def nsp_examples(
    docs: datasets.Dataset, tokenizer: Tokenizer, num_proc: int | None = None, **pairing
) -> datasets.Dataset:
    """Documents -> NSP pairs: split into tokenized sentences, then paired (`pairing`: the
    arguments of `frame_pairs`)."""
    sentences = tokenize_sentences(docs, tokenizer, num_proc)
    return frame_pairs(sentences, tokenizer, num_proc=num_proc, **pairing)


class NSPDataModule(PretrainDataModule):
    """MLM + NSP: examples are sentence pairs with `next_sentence_label`, instead of blocks.
    `dupe_factor`: passes over the corpus with different pairings (BERT used 10).
    `nsp`: the pairs train the NSP loss too (BERT), else MLM alone."""

    def __init__(self, *, short_seq_prob: float, dupe_factor: int, nsp: bool, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= short_seq_prob <= 1.0:
            raise UserError(f"data.short_seq_prob={short_seq_prob}; expected 0..1")
        if dupe_factor < 1:
            raise UserError(f"data.dupe_factor={dupe_factor}; expected at least 1")
        if self.max_seq_length < 5:
            raise UserError(f"data.max_seq_length={self.max_seq_length}; NSP needs at least 5")
        if self.packing != "document":  # read by the MLM framing only
            raise UserError(
                f"data.packing={self.packing!r}: NSP examples are sentence pairs, one an "
                "example, padded per batch (data.packing=document)"
            )
        if self.cache_format != "arrow":
            raise UserError("NSP pairs use the Arrow cache: data.cache_format must be arrow")
        self.nsp = nsp
        self.examples = partial(
            nsp_examples,
            num_proc=self.num_proc,
            max_seq_length=self.max_seq_length,
            short_seq_prob=short_seq_prob,
            dupe_factor=dupe_factor,
            seed=self.seed,
        )

    def data_record(self, tokenizer: Tokenizer | None = None) -> dict:
        pairing = self.examples.keywords
        return super().data_record(tokenizer) | {
            "data.nsp": self.nsp,
            "data.short_seq_prob": pairing["short_seq_prob"],
            "data.dupe_factor": pairing["dupe_factor"],
        }
