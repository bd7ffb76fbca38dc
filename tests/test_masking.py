import math

import pytest
import torch

from bert_lightning.data.masking import MLMCollator
from helpers import masking

PAD, UNK, CLS, SEP, MASK = range(5)
V = 1000


def collator(padded: bool = True, **kw) -> MLMCollator:
    return MLMCollator(PAD, MASK, [PAD, UNK, CLS, SEP, MASK], V, masking(**kw), padded=padded)


def random_examples(n: int, g: torch.Generator) -> list[dict]:
    """Examples of varied length framed by [CLS] ... [SEP], so batches carry padding."""
    out = []
    for _ in range(n):
        length = int(torch.randint(4, 30, (1,), generator=g))
        ids = torch.randint(5, V, (length,), generator=g).tolist()
        out.append({"input_ids": [CLS, *ids, SEP]})
    return out


def test_masking_statistics_over_10k_sequences():
    g = torch.Generator().manual_seed(0)
    col, pad_only = collator(), collator(mlm_probability=1.0)  # the second: room for all
    picked = masked = randomised = kept = real = 0
    for _ in range(100):  # 100 batches x 100 sequences
        examples = random_examples(100, g)
        batch = col(examples)
        original = pad_only([dict(e, labels=e["input_ids"]) for e in examples])
        ids, labels = batch["input_ids"], batch["labels"]
        orig = original["input_ids"]
        is_real = ~torch.isin(orig, torch.tensor([PAD, CLS, SEP]))
        sel = labels != -100
        # specials and padding are never picked; labels hold the original id exactly there
        assert not (sel & ~is_real).any()
        assert torch.equal(labels[sel], orig[sel])
        real += int(is_real.sum())
        picked += int(sel.sum())
        masked += int((sel & (ids == MASK)).sum())
        kept += int((sel & (ids == orig)).sum())
        randomised += int((sel & (ids != MASK) & (ids != orig)).sum())
        assert not (~sel & (ids != orig)).any()  # nothing changes off the picked positions
    assert real > 150_000
    assert abs(picked / real - 0.15) < 0.005
    assert abs(masked / real - 0.12) < 0.005
    # a random draw equals the original 1 time in 995: counted with "kept", within tolerance
    assert abs(randomised / real - 0.015) < 0.003
    assert abs(kept / real - 0.015) < 0.003


def test_rates_are_config_values():
    g = torch.Generator().manual_seed(1)
    col = collator(mlm_probability=0.3, p_mask=1.0, p_random=0.0)
    batch = col(random_examples(2000, g))
    sel = batch["labels"] != -100
    real = int((batch["input_ids"] > SEP).sum())  # [MASK] (id 4) included
    assert abs(sel.sum().item() / real - 0.3) < 0.01
    assert torch.all(batch["input_ids"][sel] == MASK)


def test_random_replacements_are_never_special():
    g = torch.Generator().manual_seed(2)
    col = collator(p_mask=0.0, p_random=1.0)
    batch = col(random_examples(500, g))
    sel = batch["labels"] != -100
    assert (batch["input_ids"][sel] >= 5).all()


def test_padding_and_attention_mask():
    col = collator(mlm_probability=0.0)
    batch = col([{"input_ids": [CLS, 7, 8, SEP]}, {"input_ids": [CLS, 9, SEP]}])
    assert batch["input_ids"].tolist() == [[CLS, 7, 8, SEP], [CLS, 9, SEP, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]
    assert (batch["labels"] == -100).all()
    rows = [{"input_ids": [CLS, 7, SEP]}, {"input_ids": [CLS, 9, SEP]}]
    # padded data: a mask even where a batch needs none (the data option decides, not a read)
    assert col(rows)["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 1]]
    packed = collator(padded=False, mlm_probability=0.0)(rows)
    assert "attention_mask" not in packed  # packed blocks: no mask, the fast attention path


def test_each_row_has_its_share_picked_and_at_most_k():
    """p x n of a row's n real tokens, rounded up or down at random (the mean is p x n), so no
    row has more than K = ceil(p x T) picks: `mlm_positions` is (B, K), the picks first."""
    g = torch.Generator().manual_seed(3)
    col = collator()
    for _ in range(20):
        examples = random_examples(64, g)
        batch = col(examples)
        labels, positions = batch["labels"], batch["mlm_positions"]
        T = labels.size(1)
        assert positions.shape == (64, math.ceil(0.15 * T))
        n = torch.tensor([len(e["input_ids"]) - 2 for e in examples])  # real tokens
        count = (labels != -100).sum(1)
        assert ((count - 0.15 * n).abs() < 1).all()
        picked = labels.gather(1, positions) != -100  # (B, K) the picks first, then the rest
        assert torch.equal(picked.sum(1), count)
        assert not (picked[:, 1:] & ~picked[:, :-1]).any()
        assert (positions.diff(dim=1)[picked[:, 1:]] > 0).all()  # picks in position order


def test_fresh_mask_every_batch():
    col = collator()
    examples = [{"input_ids": [CLS, *range(5, 105), SEP]}] * 4
    a, b = col(examples)["labels"], col(examples)["labels"]
    assert not torch.equal(a, b)


def test_premasked_examples_are_only_padded():
    col = collator()
    ex = [{"input_ids": [CLS, MASK, 9, SEP], "labels": [-100, 8, -100, -100]}]
    batch = col(ex + [{"input_ids": [CLS, SEP], "labels": [-100, -100]}])
    assert batch["input_ids"][0].tolist() == [CLS, MASK, 9, SEP]
    assert batch["labels"].tolist() == [[-100, 8, -100, -100], [-100, -100, -100, -100]]


def test_whole_word_masking_picks_words_whole():
    """Ids 500+ are `##` pieces: each word is a piece < 500 and its following pieces >= 500.
    Every word is picked with all its pieces or none, and 15% of the words are picked."""
    g = torch.Generator().manual_seed(2)
    col = MLMCollator(
        PAD, MASK, [PAD, UNK, CLS, SEP, MASK], V, masking(whole_word=True), range(500, V)
    )
    words = picked_words = 0
    for _ in range(20):
        examples = random_examples(200, g)
        batch = col(examples)
        for e, labels in zip(examples, batch["labels"].tolist(), strict=True):
            ids, sel = (
                e["input_ids"][1:-1],
                [lab != -100 for lab in labels[1 : len(e["input_ids"]) - 1]],
            )
            groups, cur = [], []
            for k, t in enumerate(ids):
                if t < 500 and cur or k == 0:
                    if cur:
                        groups.append(cur)
                    cur = []
                cur.append(sel[k])
            groups.append(cur)
            for grp in groups:
                assert all(grp) or not any(grp)  # never part of a word
                words += 1
                picked_words += grp[0]
    assert words > 20_000 and abs(picked_words / words - 0.15) < 0.01


def test_whole_word_masking_needs_continuation_ids():
    with pytest.raises(ValueError, match="whole_word"):
        collator(whole_word=True)
