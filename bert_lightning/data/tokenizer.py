"""The WordPiece tokenizer: trained from a text stream, or loaded from a BERT `vocab.txt`."""

from __future__ import annotations

import json
import logging
import os
import re
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import WordPieceTrainer

from bert_lightning.atomic import atomic_path
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.progress import Waiting, progress
from bert_lightning.shipped import group_defaults

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass(kw_only=True)
class TokenizerConfig:
    """`data.tokenizer`: an existing tokenizer, or how to train a WordPiece one; its values live
    in the config (conf/data/_corpus.yaml)."""

    path: str | None  # tokenizer.json or a BERT vocab.txt; None: train one
    vocab_size: int
    min_frequency: int
    max_docs: int | None  # train on the first documents of the stream (None: all)
    extend: int  # new words for a given tokenizer (`extend_wordpiece`); 0: none


def _check_specials(vocab: dict[str, int]) -> None:
    missing = [t for t in SPECIAL_TOKENS if t not in vocab]
    if missing:
        raise UserError(f"vocabulary lacks the special tokens {missing}")


def _add_bert_framing(tok: Tokenizer, vocab: dict[str, int]) -> Tokenizer:
    """`[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` with segment ids 0/1; specials never split."""
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A:0 [SEP]:0",
        pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def _bert_tokenizer(vocab: dict[str, int]) -> Tokenizer:
    """BERT uncased pipeline: NFD + lowercase + strip accents, BERT pre-tokenization, WordPiece."""
    _check_specials(vocab)
    tok = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return _add_bert_framing(tok, vocab)


def symbol_tokenizer(symbols: list[str]) -> Tokenizer:
    """Whitespace-separated symbols, case kept, ids after the specials: for synthetic corpora
    (the brackets toy) whose vocabulary is known up front."""
    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + list(symbols))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return _add_bert_framing(tok, vocab)


def _lines(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def load_vocab_txt(path: str | os.PathLike) -> Tokenizer:
    """A BERT `vocab.txt` (one token a line, id = line number): ids match BERT's. Lines end at
    LF, CR or CRLF and nowhere else, as in BERT's reader (`str.splitlines` would also split at
    `\\x0c`, `\\x85`, `\\u2028`, ..., shifting every id after such a token)."""
    data = Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[: e.start]  # the byte is counted from the start of its line
        line_start = max(before.rfind(b"\n"), before.rfind(b"\r")) + 1
        line, byte = len(_lines(before.decode())), e.start - line_start
        raise UserError(f"{path}:{line}: invalid UTF-8 ({e.reason} at byte {byte})") from None
    lines = _lines(text)
    if lines and lines[-1] == "":  # the end of the last line, not an empty token
        lines.pop()
    vocab: dict[str, int] = {}
    for i, token in enumerate(lines):
        if token in vocab:
            raise UserError(f"{path}:{i + 1}: token {token!r} repeats line {vocab[token] + 1}")
        vocab[token] = i
    try:
        return _bert_tokenizer(vocab)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None


def separates(c: str) -> bool:
    """Whether BERT's pre-tokenizer cuts at `c`: whitespace, or punctuation (ASCII's, or a
    Unicode P* category), which becomes a word of its own."""
    return (
        c.isspace()
        or (c.isascii() and c.isprintable() and not c.isalnum())
        or (unicodedata.category(c).startswith("P"))
    )


class ContinuationChars:
    """The characters that follow another within a word of BERT's pre-tokenizer (`##c`).
    The normalizer works character by character, so a raw character `r` can only bring
    `candidates(r)`: the non-separators of its normalization not after a separator there
    (a CJK character, which it surrounds with spaces, brings none). A text is normalized and
    read (`_scan`) only while it holds a character whose candidates are not all found yet;
    the others cost one `set()` of the text. The scan removes each word's first character with
    one regular expression and keeps what is left but the separators."""

    def __init__(self, normalizer):
        self.normalizer = normalizer
        self.found: set[str] = set()
        self.raw: dict[str, frozenset[str]] = {}  # each raw character seen: its candidates
        self.open: set[str] = set()  # raw characters with a candidate not found yet
        self.seen: set[str] = set()  # normalized characters seen by a scan
        self.separators: set[str] = set()
        self.first = None  # a word's first character: one not after a non-separator

    def candidates(self, c: str) -> frozenset[str]:
        n = self.normalizer.normalize_str(c)
        return frozenset(
            x for i, x in enumerate(n) if not separates(x) and (i == 0 or not separates(n[i - 1]))
        )

    def add(self, text: str) -> None:
        chars = set(text)
        for c in chars - self.raw.keys():
            self.raw[c] = self.candidates(c)
            self.open.add(c)
        if chars & self.open:
            self._scan(self.normalizer.normalize_str(text))
            self.open = {c for c in self.open if not self.raw[c] <= self.found}

    def _scan(self, text: str) -> None:
        new = set(text) - self.seen
        if new or self.first is None:
            self.seen |= new
            self.separators |= {c for c in new if separates(c)}
            cls = "".join(re.escape(c) for c in sorted(self.separators))
            self.first = re.compile(f"(?<![^{cls}])[^{cls}]" if cls else "^.", re.DOTALL)
        self.found |= set(self.first.sub("", text)) - self.separators


SHIPPED = group_defaults("data", "_corpus")["tokenizer"]  # a run's settings (data.tokenizer)


def train_wordpiece(
    texts: Callable[[], Iterator[str]],
    vocab_size: int,
    min_frequency: int = SHIPPED["min_frequency"],
    max_docs: int | None = SHIPPED["max_docs"],
) -> Tokenizer:
    """Train on a stream of documents; `texts()` is called twice and must give the same stream.

    `tokenizers` alone gives a different vocab on every run (continuation pieces come out in hash
    order). Declaring every continuation character `##c` up front in sorted order fixes the
    order and makes training reproducible; the first pass over the stream collects them.
    """
    probe = _bert_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS)})
    norm, pre = probe.normalizer, probe.pre_tokenizer
    log.info(
        "training a WordPiece tokenizer of %d tokens on %s documents, in two passes",
        vocab_size, f"up to the first {max_docs:,}" if max_docs else "all",
    )  # fmt: skip
    start = time.monotonic()
    chars = ContinuationChars(norm)
    docs = 0
    with Waiting("tokenizer, pass 1 of 2") as wait:
        for text in counted(texts, max_docs, wait, None):  # how many: known after it
            docs += 1
            chars.add(text)
    if not docs:  # it would hold the special tokens only
        raise ValueError("no documents to train a WordPiece tokenizer on")
    alphabet = sorted("##" + c for c in chars.found)

    trainable = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    trainable.normalizer, trainable.pre_tokenizer = norm, pre
    trainer = WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS + alphabet,
        show_progress=False,
    )
    with Waiting("tokenizer, pass 2 of 2") as wait:  # and the vocabulary made after it
        trainable.train_from_iterator(counted(texts, max_docs, wait, docs), trainer)
    vocab = trainable.get_vocab()
    took = time.monotonic() - start
    log.info(
        "trained a WordPiece vocabulary of %d tokens on %d documents in %.0f s",
        len(vocab),
        docs,
        took,
    )
    return _bert_tokenizer(vocab)


def counted(
    texts: Callable[[], Iterator[str]], max_docs: int | None, wait: Waiting, total: int | None
) -> Iterator[str]:
    """The first `max_docs` of `texts()` through `progress` (whose `Ticks` speak on a document
    alone), the documents read so far named in `wait`'s line, which comes every SECONDS off a
    terminal also while no document does (before the first, while `texts()` orders the files'
    rows, and after the last, while the vocabulary is made)."""
    what, of = wait.what, f" of {total:,}" if total else ""
    wait.what = f"{what}, 0{of} documents read"
    for n, text in enumerate(progress(islice(texts(), max_docs), what, total), 1):
        wait.what = f"{what}, {n:,}{of} documents read"
        yield text


def extend_wordpiece(
    tok: Tokenizer, texts: Iterable[str], n: int
) -> tuple[Tokenizer, dict[str, list[int]]]:
    """A domain's vocabulary: the `n` most frequent words of `texts` that `tok` cuts into 3 or
    more pieces (none unknown) become whole-word tokens after its last id; also each new word's
    pieces, whose embedding rows start its own. Ties go in alphabetical order."""
    if not isinstance(tok.model, models.WordPiece):
        raise UserError(f"data.tokenizer.extend needs a WordPiece tokenizer, not {tok.model}")
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(
            w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))
        )
    vocab, unk = tok.get_vocab(), tok.token_to_id("[UNK]")
    new: dict[str, list[int]] = {}
    for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(new) == n:
            break
        pieces = [t.id for t in tok.model.tokenize(word)] if word not in vocab else []
        if len(pieces) >= 3 and unk not in pieces:
            new[word] = pieces
    raw = json.loads(tok.to_str())
    first = tok.get_vocab_size()
    raw["model"]["vocab"] |= {w: first + i for i, w in enumerate(new)}
    log.info(
        "data.tokenizer.extend=%d: %d new words (of %d distinct), e.g. %s",
        n, len(new), len(counts), list(new)[:10],
    )  # fmt: skip
    return Tokenizer.from_str(json.dumps(raw)), new


def save_tokenizer(tok: Tokenizer, path: str | os.PathLike) -> None:
    """Write through a temporary name so that a crash never leaves a half-written file."""
    with atomic_path(path) as tmp:
        tok.save(str(tmp))


# what a file's tokenizer may hold: a BERT WordPiece tokenizer's components, each growing a
# text by a bounded factor (a `Replace` normalizer made each character 20,000, so a 307-character
# request took 21.8 s and 1.9 GB)
NORMALIZERS = {"BertNormalizer", "NFD", "NFC", "NFKD", "NFKC", "Lowercase", "StripAccents", "Strip"}
PRE_TOKENIZERS = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit", "Punctuation", "Digits"}
MODELS = {"WordPiece", "WordLevel"}  # WordLevel: `symbol_tokenizer`'s, a word a token
POST_PROCESSORS = {"TemplateProcessing", "BertProcessing"}
DECODERS = {"WordPiece"}
MAX_STEPS = 8  # components of a Sequence: BertNormalizer's spaces around a CJK character add up
MAX_WORD_CHARS = 200  # WordPiece's max_input_chars_per_word; its cost grows as its square
MAX_PREFIX = 2  # WordPiece's continuing_subword_prefix ("##"): each lookup of a piece copies it
MAX_FRAMING = 8  # tokens a post-processor adds to a pair (BERT's: 3)


def _steps(node: dict | None, key: str) -> list[dict]:
    """A normalizer's or pre-tokenizer's components, nested Sequences flattened."""
    if node is None:
        return []
    if node["type"] == "Sequence":
        return [s for child in node[key] for s in _steps(child, key)]
    return [node]


def _unbounded(tok: Tokenizer) -> str | None:
    """What in `tok` is not a bounded part of a BERT WordPiece tokenizer, or None."""
    raw = json.loads(tok.to_str())
    for what, key, allowed in (
        ("normalizer", "normalizers", NORMALIZERS),
        ("pre_tokenizer", "pretokenizers", PRE_TOKENIZERS),
    ):
        steps = _steps(raw[what], key)
        if other := next((s["type"] for s in steps if s["type"] not in allowed), None):
            return f"{what} {other}: expected {', '.join(sorted(allowed))} or a Sequence of them"
        if len(steps) > MAX_STEPS:
            return f"{what}: a Sequence of {len(steps)} steps; at most {MAX_STEPS}"
    model = raw["model"]
    if model["type"] not in MODELS:
        return f"model {model['type']}: expected {' or '.join(sorted(MODELS))}"
    if model.get("max_input_chars_per_word", 0) > MAX_WORD_CHARS:
        return (
            f"model WordPiece: max_input_chars_per_word {model['max_input_chars_per_word']}; "
            f"at most {MAX_WORD_CHARS} (BERT's: 100)"
        )
    if len(prefix := model.get("continuing_subword_prefix") or "") > MAX_PREFIX:
        return (
            f"model WordPiece: continuing_subword_prefix {prefix[:20]!r}...; at most {MAX_PREFIX}"
        )
    for what, allowed in (("post_processor", POST_PROCESSORS), ("decoder", DECODERS)):
        if raw[what] is not None and raw[what]["type"] not in allowed:
            return f"{what} {raw[what]['type']}: expected {' or '.join(sorted(allowed))} or none"
    if (
        tok.post_processor
        and (n := tok.post_processor.num_special_tokens_to_add(True)) > MAX_FRAMING
    ):
        return f"post_processor: adds {n} tokens to a pair; at most {MAX_FRAMING}"
    for t in raw["added_tokens"]:
        if t["normalized"] and (t["special"] or t["content"] in SPECIAL_TOKENS):
            return (
                f"added token {t['content']!r}: normalized (it would match other texts than "
                "its own, `[mask]` for `[MASK]`); a special token must not be"
            )
    return None


def tokenizer_from_json(text: str, where) -> Tokenizer:
    """A tokenizer read from a file (`where`: it, for the message): a model's data, so it must
    be a BERT WordPiece tokenizer with the special tokens, each component bounded in how much it
    grows a text (`_unbounded`). Padding and truncation that a published file fixes (e.g.
    all-MiniLM-L6-v2's 128) are dropped: framing is the pipeline's job, and a truncating
    tokenizer would keep one block of every document."""
    try:
        tok = Tokenizer.from_str(text)
    except Exception as e:  # the Rust library's own error: a bad JSON or an unknown model
        raise UserError(f"{where}: not a tokenizer.json ({' '.join(str(e).split())})") from None
    missing = [t for t in SPECIAL_TOKENS if tok.token_to_id(t) is None]
    if missing:
        raise UserError(f"{where}: tokenizer lacks the special tokens {missing}")
    if why := _unbounded(tok):
        raise UserError(f"{where}: tokenizer {why}")
    tok.no_padding()
    tok.no_truncation()
    return tok


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """`tokenizer.json` (ours or any BERT one, `tokenizer_from_json`) or a BERT `vocab.txt`."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path}: no such tokenizer file")
    if path.suffix == ".txt":
        return load_vocab_txt(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a tokenizer.json (invalid UTF-8 at byte {e.start})") from None
    return tokenizer_from_json(text, path)


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def batch_encode(tok: Tokenizer, texts: Iterable[str]) -> list[list[int]]:
    """Ids without `[CLS]`/`[SEP]`: examples are framed later (packing, truncation, pairs)."""
    return [e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)]
