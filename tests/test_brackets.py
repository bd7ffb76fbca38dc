import pytest
import torch

from bert_lightning.data.brackets import (
    CLOSERS,
    OPENERS,
    brackets_tokenizer,
    sentences,
    to_input_ids,
    ungrammatical,
)
from bert_lightning.experiments.brackets.report import (
    brackets_masking,
    evaluate,
    masking_stats,
    run_all,
)
from bert_lightning.model import PreTrainingOutput

TOK = brackets_tokenizer()


def test_sentences_are_bracket_pairs():
    ids = to_input_ids(sentences(100, 8, torch.Generator().manual_seed(0)), TOK)
    assert ids.shape == (100, 17) and torch.all(ids[:, 0] == TOK.token_to_id("[CLS]"))
    tokens = [[TOK.id_to_token(i) for i in row] for row in ids[:, 1:].tolist()]
    for row in tokens:
        pairs = zip(row[::2], row[1::2], strict=True)
        assert all(o in OPENERS and c == o.upper() for o, c in pairs)


def test_ungrammatical_swaps_exactly_one_closer():
    g = torch.Generator().manual_seed(1)
    good = sentences(500, 8, g)
    bad = ungrammatical(good, g)
    diff = good != bad
    assert torch.all(diff.sum(1) == 1) and not diff[:, ::2].any()  # one closer, no opener
    assert torch.all(bad[:, 1::2] >= len(OPENERS)) and torch.all(bad < len(OPENERS) + len(CLOSERS))


def test_masking_statistics_match_the_tutorial():
    s = masking_stats()
    assert s["real tokens"] == 160_000
    assert abs(s["picked"] - 15.0) < 0.5 and abs(s["[MASK]"] - 12.0) < 0.5
    assert abs(s["random"] - 1.5) < 0.3 and abs(s["kept"] - 1.5) < 0.3


class Oracle(torch.nn.Module):
    """Right on closers (the label), wrong on openers: checks evaluate's bookkeeping."""

    def forward(self, input_ids, labels, mlm_positions):
        picked = labels != -100
        target = labels[picked]
        closer = target >= TOK.token_to_id(CLOSERS[0])
        pred = torch.where(closer, target, TOK.token_to_id("[UNK]"))
        logits = torch.nn.functional.one_hot(pred, TOK.get_vocab_size()).float()
        return PreTrainingOutput(None, None, None, logits, target, None)


def test_evaluate_splits_by_role_and_kind():
    r = evaluate(Oracle(), TOK, brackets_masking([]), n=2000)
    assert r["closers"] == 100.0 and r["openers"] == 0.0
    assert 40 < r["overall"] < 60 and 40 < r["[MASK]"] < 60


@pytest.mark.slow
def test_textbook_claims_hold(tmp_path):
    """600-step runs through train(cfg), 300-step fine-tuning through finetune(cfg): the gaps
    the BERT paper's argument rests on (claims 2-5; 5 with the experiment's max pooling)."""
    quiet = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]
    finetunes = ["frozen encoder, head only", "fine-tuned from pretrained", "from a random encoder"]
    r = run_all(tmp_path, quiet, ["bidirectional", "causal", "always_mask"], finetunes)
    assert r["bidirectional"]["overall"] >= 85
    assert r["causal"]["openers"] <= 30 and r["causal"]["closers"] >= 85
    assert r["always_mask"]["kept"] <= r["bidirectional"]["kept"] - 25
    ft = r["finetune"]
    # a bound below what these seeds usually reach: the same seeds land some points apart on
    # different CPUs (docs/sanity-suite.md), and the claim is the gap to the two below
    assert ft["fine-tuned from pretrained"] >= 85
    assert ft["frozen encoder, head only"] <= 60 and ft["from a random encoder"] <= 60


def test_grammar_rows_are_half_ungrammatical():
    from bert_lightning.data.brackets import grammar_rows

    rows = grammar_rows(2000, 8, torch.Generator().manual_seed(3))
    assert abs(sum(r["label"] for r in rows) / 2000 - 0.5) < 0.05
    for r in rows[:200]:
        sym = r["sentence"].split()
        wrong = sum(c != o.upper() for o, c in zip(sym[::2], sym[1::2], strict=True))
        assert wrong == 1 - r["label"]


def test_report_command_prints_tables_and_saves_plots(tmp_path, monkeypatch, capsys):
    """`bert-lightning report brackets OUT overrides...`: the overrides reach every run, the
    tables carry the reported numbers, results.json and both plots are written."""
    from bert_lightning.cli import main
    from bert_lightning.experiments.brackets import report as brackets

    seen = {}

    def fake_run_all(out_dir, extra):
        seen["out"], seen["extra"] = out_dir, extra
        kinds = dict.fromkeys(["overall", "[MASK]", "random", "kept", "openers", "closers"], 50.0)
        mlm = {**kinds, "partner intact": 90.0, "partner hidden": 20.0, "first train loss": 0.0}
        r = {name: dict(mlm) for name in brackets.VARIANTS}
        r["stats"] = masking_stats(n=100)
        r["finetune"] = dict.fromkeys(brackets.FINETUNE_VARIANTS, 50.0)
        return r

    monkeypatch.setattr(brackets, "run_all", fake_run_all)
    main(["report", "brackets", str(tmp_path), "trainer.max_steps=5"])
    assert seen == {"out": tmp_path, "extra": ["trainer.max_steps=5"]}
    printed = capsys.readouterr().out
    assert "reported  89.4" in printed and "reported  99.2" in printed
    assert (tmp_path / "results.json").is_file()
    assert (tmp_path / "brackets_accuracy_by_kind.png").stat().st_size > 0
    assert (tmp_path / "brackets_loss_curves.png").stat().st_size > 0
