"""Replaced-token detection (`objective=rtd`, ELECTRA): the corruption, both losses against a
computation of their own, the FLOP formula, a run whose discriminator learns, and its
checkpoint as an encoder (export to `transformers.BertModel`, fine-tuning)."""

import csv
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.data.masking import picked_positions
from bert_lightning.errors import UserError
from bert_lightning.model import BertConfig, ElectraForPreTraining, generator_config, rtd_flops
from bert_lightning.model.electra import corrupt, row_uniforms, sample_tokens
from bert_lightning.training.pretrain import train
from helpers import TINY_BERT, tiny_overrides, write_corpus

CONFIG = BertConfig(vocab_size=97, **TINY_BERT)
MASK_ID = 4


def masked_batch(B=3, T=12, pad_from=(12, 8, 5)):
    """(masked ids, labels, attention mask, original ids): ~30% of the real tokens picked, all
    replaced by [MASK] in the input, as MLMCollator with p_mask=1 does."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(5, CONFIG.vocab_size, (B, T), generator=g)
    mask = (torch.arange(T) < torch.tensor(pad_from)[:, None]).long()  # (B, T)
    ids = ids.masked_fill(mask == 0, 0)
    picked = (torch.rand(B, T, generator=g) < 0.3) & mask.bool()
    picked[:, 0] = False  # [CLS]
    picked[0, 3] = True
    labels = torch.where(picked, ids, -100)
    return ids.masked_fill(picked, MASK_ID), labels, mask, ids


def test_corruption_differs_only_at_picked_positions_and_labels_say_changed():
    masked, labels, _, original = masked_batch()
    picked = labels != -100
    K = 6
    positions = picked_positions(labels, K)  # (B, K): the picks, then unpicked positions
    sampled = torch.randint(5, CONFIG.vocab_size, (3, K))  # one a position, used at the picks
    first = picked.flatten().nonzero()[0]
    sampled[0, 0] = labels.flatten()[first]  # a sample equal to the original token
    corrupted, replaced = corrupt(masked, labels, positions, sampled)
    assert torch.equal(corrupted[~picked], original[~picked])
    assert torch.equal(corrupted[picked], sampled[labels.gather(1, positions) != -100])
    assert torch.equal(replaced, corrupted != original)
    assert not replaced[~picked].any()
    assert not replaced.flatten()[first]  # sampled the original: counts as original


def test_both_losses_equal_a_dense_computation_of_their_own():
    """The generator's loss from a dense pass over every position (no picked-rows last layer,
    no unpadding), the discriminator's BCE written out, on the corruption the model drew."""
    torch.manual_seed(0)
    model = ElectraForPreTraining(CONFIG, 0.5, 50.0).eval()
    masked, labels, mask, original = masked_batch()
    out = model(masked, None, mask, labels=labels, mlm_positions=picked_positions(labels), seed=3)
    assert out.loss.item() == pytest.approx(out.gen_loss.item() + 50.0 * out.disc_loss.item())

    gen, bert = model.generator, model.bert
    with torch.no_grad():
        ext = mask[:, None, None, :].bool()
        h = gen.embeddings_project(bert.embeddings(masked))  # (B, T, Hg)
        h, _ = gen.encoder(h, ext)
        logits = gen.logits(h)  # (B, T, V)
        picked = labels != -100
        gen_loss = F.cross_entropy(logits[picked], labels[picked])
        # the same draws from the same distributions: one a position in `picked_positions`
        # order (room for every position), the picks first in each row
        B, T, V = logits.shape
        order = picked_positions(labels, T)  # (B, T)
        probs = logits.gather(1, order[..., None].expand(-1, -1, V)).softmax(-1)  # (B, T, V)
        u = row_uniforms(original, mask.bool(), T, 3)  # (B, T): the model's K first of each
        sampled = sample_tokens(probs.flatten(0, 1), u.flatten())
        corrupted = original.clone()
        corrupted[picked] = sampled.view(B, T)[picked.gather(1, order)]
        y = (corrupted != original)[mask.bool()].float()
        h = bert(corrupted, None, mask, unpad=False).last_hidden_state  # (B, T, H)
        z = model.discriminator_predictions(h)
        p = torch.sigmoid(z[mask.bool()])
        disc_loss = -(y * p.log() + (1 - y) * (1 - p).log()).mean()
    assert torch.equal(out.corrupted, corrupted)
    assert out.gen_loss.item() == pytest.approx(gen_loss.item(), rel=1e-5)
    assert out.disc_loss.item() == pytest.approx(disc_loss.item(), rel=1e-5)
    assert out.disc_logits.shape == (B, T)  # one a position; the loss of the real ones
    assert torch.equal(out.real, mask.bool())


def test_sampled_tokens_follow_the_distribution():
    """200,000 draws from 3 rows: each token's share within 0.005 of its probability, and a
    token of probability 0 never drawn."""
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 1.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    n = 200_000
    u = torch.rand(3 * n, generator=torch.Generator().manual_seed(0))
    drawn = sample_tokens(probs.repeat(n, 1), u).view(n, 3)  # (n, 3)
    for row in range(3):
        share = torch.bincount(drawn[:, row], minlength=4).double() / n
        assert (share - probs[row]).abs().max() < 0.005, (row, share)
        assert (share[probs[row] == 0] == 0).all()


def test_a_rows_validation_draws_are_its_own_in_any_batch():
    """A validation's draws (`seed`): a function of each row's text, its pick and the seed, so
    the RTD validation loss is the same at any batch size or number of processes (seeded by
    the batch, 38.6645 at batch 48 was 38.6665 at batch 8). 2,000 rows x 16 picks: uniform
    (mean 1/2, variance 1/12, each tenth within 1% of its share)."""
    masked, labels, mask, original = masked_batch()
    whole = row_uniforms(original, mask.bool(), 4, 7)  # (3, 4)
    for b, length in enumerate([12, 8, 5]):  # each row alone, without the batch's padding
        alone = row_uniforms(original[b : b + 1, :length], mask[b : b + 1, :length].bool(), 4, 7)
        assert torch.equal(alone[0], whole[b])
    assert not torch.equal(row_uniforms(original, mask.bool(), 4, 8), whole)  # the seed counts
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(5, 30_000, (2_000, 64), generator=g)
    u = row_uniforms(rows, torch.ones_like(rows, dtype=torch.bool), 16, 0).flatten()
    assert abs(u.mean().item() - 0.5) < 0.01 and abs(u.var().item() - 1 / 12) < 0.002
    tenths = torch.bincount((u * 10).long(), minlength=10).double() / u.numel()
    assert (tenths - 0.1).abs().max() < 0.01
    # independent within a row: no correlation between picks, and six fair coins per row give
    # a binomial count of heads (an affine hash put a row's picks on a lattice: never 0 or 6)
    pairs = u.view(2_000, 16)
    assert abs(np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1]) < 0.08
    heads = (pairs[:, :6] < 0.5).sum(1)  # (2000,)
    expected = 2_000 * stats.binom.pmf(range(7), 6, 0.5)
    assert stats.chisquare(torch.bincount(heads, minlength=7).numpy(), expected).pvalue > 1e-3
    torch.manual_seed(0)
    model = ElectraForPreTraining(CONFIG, 0.5, 50.0).eval()
    with torch.no_grad():
        both = model(
            masked, None, mask, labels=labels, mlm_positions=picked_positions(labels), seed=7
        )
        first = model(masked[:1], None, mask[:1], labels=labels[:1],
                      mlm_positions=picked_positions(labels[:1]), seed=7)  # fmt: skip
    assert torch.equal(first.corrupted[0], both.corrupted[0])


def test_generator_shares_the_embeddings_and_its_output_is_tied():
    model = ElectraForPreTraining(CONFIG, 0.5, 50.0)
    assert model.generator.generator_lm_head.weight is model.bert.embeddings.word_embeddings.weight
    assert model.generator.config.hidden_size == 16
    emb = model.bert.embeddings
    shared = {id(p) for p in model.generator.parameters()} & {id(p) for p in emb.parameters()}
    assert shared == {id(emb.word_embeddings.weight)}  # the rest of the embeddings: called
    assert model.bert.pooler is None


def test_generator_shape_and_refusals():
    c = BertConfig(hidden_size=256, num_attention_heads=4, intermediate_size=1024)
    g = generator_config(c, 0.25)
    assert (g.hidden_size, g.num_attention_heads, g.intermediate_size) == (64, 1, 256)
    assert g.num_hidden_layers == c.num_hidden_layers
    with pytest.raises(UserError, match=r"objective.generator_hidden_size=1.5; expected a share"):
        generator_config(c, 1.5)
    with pytest.raises(UserError, match="width must be a positive multiple of the heads"):
        generator_config(BertConfig(hidden_size=12, num_attention_heads=4), 0.4)


def test_rtd_flops_match_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    model = ElectraForPreTraining(CONFIG, 0.5, 50.0).train()  # dropout: SDPA's counted path
    masked, labels, mask, _ = masked_batch()
    B, T = masked.shape
    with FlopCounterMode(display=False) as counter:
        model(
            masked, None, mask, labels=labels, mlm_positions=picked_positions(labels)
        ).loss.backward()
    P, R = B * T, B * (1 + T)  # `mlm_positions` with room for every position
    g = model.generator.config
    expected = rtd_flops(CONFIG, g, B, T, P, R, tokens=int(mask.sum()))
    assert expected == counter.get_total_flops()


def rows(out_dir):
    with open(out_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def rtd_run(tmp_path_factory):
    """A 20-step RTD run of the tiny model; its folder."""
    out = tmp_path_factory.mktemp("rtd")
    write_corpus(out / "corpus.jsonl", 60)
    overrides = tiny_overrides(
        out, "objective=rtd", "trainer.max_steps=20", "trainer.val_check_interval=10"
    )
    train(compose(overrides=overrides))
    return out


@pytest.mark.slow
def test_a_20_step_run_logs_both_parts_and_its_discriminator_learns(rtd_run):
    train_rows = [r for r in rows(rtd_run) if r.get("train/disc_acc")]
    assert len(train_rows) == 20
    acc = [float(r["train/disc_acc"]) for r in train_rows]
    assert sum(acc[-5:]) / 5 > sum(acc[:5]) / 5 + 0.1
    replaced = [float(r["train/replaced"]) for r in train_rows]
    # nearly every picked token (15% of a batch's, on average) is replaced by a weak generator
    assert 0.1 < sum(replaced) / len(replaced) < 0.16
    for key in ("gen_mlm_loss", "gen_mlm_acc", "disc_loss", "disc_acc", "replaced", "loss"):
        assert any(r.get(f"val/{key}") for r in rows(rtd_run)), key
    val = [float(r["val/disc_loss"]) for r in rows(rtd_run) if r.get("val/disc_loss")]
    assert val[-1] < val[0]


@pytest.mark.slow
def test_an_rtd_checkpoint_exports_its_discriminator_as_a_bert_model(rtd_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    ckpt = rtd_run / "checkpoints" / "last.ckpt"
    pre = read_checkpoint(ckpt)
    assert pre.rtd and pre.hparams["objective"] == "rtd"
    assert all(k.startswith("bert.") for k in pre.state_dict)
    out = tmp_path / "hf"
    subprocess.run(
        [sys.executable, "-m", "bert_lightning", "export-hf", str(ckpt), str(out)], check=True
    )
    hf, info = transformers.BertModel.from_pretrained(
        out, add_pooling_layer=False, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    model = ElectraForPreTraining(pre.config, 0.25, 50.0).eval()
    model.load_state_dict({k.removeprefix("model."): v for k, v in raw.items()})
    ids = torch.randint(5, pre.config.vocab_size, (2, 10))
    with torch.no_grad():
        ours = model.bert(ids).last_hidden_state
        theirs = hf.eval()(ids).last_hidden_state
    assert (ours - theirs).abs().max() <= 1e-5


@pytest.mark.slow
def test_fine_tuning_starts_from_an_rtd_checkpoint(rtd_run, tmp_path):
    from bert_lightning.training.finetune import finetune
    from finetune_fixtures import sentiment_rows, write_csv

    write_csv(tmp_path / "train.csv", sentiment_rows(48))
    ckpt = rtd_run / "checkpoints" / "last.ckpt"
    cfg = compose(
        "finetune",
        [
            "debug=tiny",
            f"paths.output_dir={tmp_path / 'ft'}",
            f"init_from={ckpt}",
            f"task.train_file={tmp_path / 'train.csv'}",
            "trainer.max_steps=3",
        ],
    )
    finetune(cfg)
    tuned = torch.load(tmp_path / "ft/checkpoints/last.ckpt", weights_only=True)["state_dict"]
    raw = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    key = "bert.embeddings.position_embeddings.weight"
    start = raw[f"model.{key}"]
    assert tuned[f"model.{key}"].shape == start.shape
    assert (tuned[f"model.{key}"] - start).abs().max() < 0.05  # it started from these weights
    assert not any("generator" in k for k in tuned)


@pytest.mark.slow
@pytest.mark.parametrize("packing", ["document", "packed_isolated"])
def test_rtd_steps_on_padded_and_document_isolated_batches(tmp_path, packing):
    """`document` framing pads each batch (the unpadded path, the BCE on real tokens only);
    `packed_isolated` passes position ids that keep attention within each document: both take
    their steps with finite losses."""
    write_corpus(tmp_path / "corpus.jsonl", 60)
    overrides = tiny_overrides(tmp_path, "objective=rtd", f"data.packing={packing}")
    assert torch.isfinite(torch.tensor(train(compose(overrides=overrides))))
    losses = [float(r["train/disc_loss"]) for r in rows(tmp_path) if r.get("train/disc_loss")]
    assert len(losses) == 6 and all(0 < x < 5 for x in losses)


def test_the_discriminator_learns_past_the_share_of_originals_where_context_tells():
    """Sequences that count up by one (each token follows from its neighbours): in 300 steps
    the discriminator tells replaced from original far better than always saying "original"."""
    torch.manual_seed(0)
    c = BertConfig(vocab_size=500, **(TINY_BERT | {"hidden_size": 64, "intermediate_size": 128}))
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0
    model = ElectraForPreTraining(c, 0.5, 50.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = (torch.randint(5, 400, (16, 1)) + torch.arange(32)) % 495 + 5  # (16, 32)
    for _ in range(300):
        picked = torch.rand(ids.shape) < 0.3
        labels = torch.where(picked, ids, -100)
        out = model(
            torch.where(picked, MASK_ID, ids), labels=labels, mlm_positions=picked_positions(labels)
        )
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    acc = ((out.disc_logits > 0) == out.replaced).float().mean().item()
    base = 1 - out.replaced.float().mean().item()
    assert acc > base + 0.15, (acc, base)
