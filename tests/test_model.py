import math

import pytest
import torch
import torch.nn.functional as F

from bert_lightning.config import compose
from bert_lightning.data.masking import picked_positions
from bert_lightning.interop import hf_to_ours
from bert_lightning.model import (
    BertConfig,
    BertForPreTraining,
    BertModel,
    encoder_parameter_formula,
    num_parameters,
    pretraining_flops,
)
from helpers import TINY_MODEL

SIZES = ["bert_tiny", "bert_mini", "bert_small", "bert_medium", "bert_base", "bert_large"]


def size_config(name: str, **kw) -> BertConfig:
    from hydra.utils import instantiate

    cfg = compose(overrides=[f"model={name}", "paths.output_dir=unused"])
    return instantiate(cfg.model, vocab_size=30522, **kw)


def test_bert_base_parameter_count_matches_bert_paper_model():
    # transformers.BertModel(BertConfig()) has exactly this many parameters
    assert num_parameters(BertModel(size_config("bert_base"))) == 109_482_240


@pytest.mark.parametrize("name", SIZES)
@pytest.mark.parametrize("pre_ln", [False, True])
def test_parameter_count_formula(name, pre_ln):
    c = size_config(name, pre_layer_norm=pre_ln)
    with torch.device("meta"):
        model = BertModel(c)
    assert num_parameters(model) == encoder_parameter_formula(c)
    assert c.intermediate_size == 4 * c.hidden_size


@pytest.mark.parametrize("pre_ln", [False, True])
def test_padding_does_not_change_real_token_outputs(pre_ln):
    model = BertModel(BertConfig(**TINY_MODEL, pre_layer_norm=pre_ln)).eval()
    ids = torch.randint(5, 97, (3, 10))
    plain = model(ids, attention_mask=torch.ones_like(ids)).last_hidden_state
    padded_ids = torch.cat([ids, torch.zeros(3, 7, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(3, 10), torch.zeros(3, 7)], dim=1).long()
    padded = model(padded_ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(padded[:, :10], plain, atol=1e-5, rtol=1e-5)
    # and the mask matters: without it the padding leaks into the real tokens
    leaked = model(padded_ids).last_hidden_state
    assert (leaked[:, :10] - plain).abs().max() > 1e-3


@pytest.mark.parametrize(("pre_ln", "causal"), [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("padded", [True, False])
def test_sparse_mlm_head_equals_dense_head(pre_ln, causal, padded):
    """The head and the last layer run on [CLS] and K positions a row only (`mlm_positions`,
    static (B, K), padded with unpicked positions): the loss equals the dense head's on
    every position (fp32, 1e-5), the logits at the picks are the dense head's, and with room
    for every position (K = T) the loss is the same."""
    config = BertConfig(**TINY_MODEL, pre_layer_norm=pre_ln, is_decoder=causal)
    model = BertForPreTraining(config).eval()
    ids = torch.randint(5, 97, (4, 16))
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    labels = torch.where((torch.rand(4, 16) < 0.3) & mask.bool(), ids, -100)
    labels[2] = -100  # a row with nothing picked
    mask = mask if padded else None
    K = 12  # more room than any row's picks
    positions = picked_positions(labels, K)  # (B, K)
    out = model(ids, attention_mask=mask, labels=labels, mlm_positions=positions)
    hidden = model.bert(ids, attention_mask=mask).last_hidden_state
    dense_logits = model.cls.predictions(hidden)  # (B, T, V) on every position
    dense_loss = F.cross_entropy(dense_logits.reshape(-1, 97), labels.reshape(-1))
    assert abs(out.mlm_loss.item() - dense_loss.item()) < 1e-5
    assert out.mlm_logits.shape == (4 * K, 97) and out.mlm_labels.shape == (4 * K,)
    picked = out.mlm_labels != -100
    assert torch.equal(out.mlm_labels[picked], labels[labels != -100])
    torch.testing.assert_close(out.mlm_logits[picked], dense_logits[labels != -100])
    roomy = model(ids, attention_mask=mask, labels=labels, mlm_positions=picked_positions(labels))
    assert abs(roomy.mlm_loss.item() - dense_loss.item()) < 1e-5
    nsp = model.cls.seq_relationship(model.bert(ids, attention_mask=mask).pooler_output)
    zeros = torch.zeros(4, dtype=torch.long)
    out = model(
        ids,
        attention_mask=mask,
        labels=labels,
        mlm_positions=picked_positions(labels),
        next_sentence_label=zeros,
    )
    torch.testing.assert_close(out.nsp_logits, nsp)


def test_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(BertConfig(**TINY_MODEL))
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert torch.all(model.bert.embeddings.word_embeddings.weight[0] == 0)  # [PAD] row


def test_same_outputs_as_transformers_bert():
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.BertConfig(**TINY_MODEL, attn_implementation="eager")
    hf = transformers.BertForPreTraining(hf_cfg).eval()
    ours = BertForPreTraining(BertConfig(**TINY_MODEL)).eval()
    missing, unexpected = ours.load_state_dict(hf_to_ours(hf.state_dict()), strict=False)
    assert not unexpected and missing == ["cls.predictions.decoder.weight"]  # tied to embeddings
    ids = torch.randint(5, 97, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    labels = torch.where(torch.rand(2, 12) < 0.5, ids, -100) * mask + (mask - 1) * 100
    nsp = torch.tensor([0, 1])
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, token_type_ids=types)
        out = ours(
            ids,
            types,
            mask,
            labels=labels,
            mlm_positions=picked_positions(labels),
            next_sentence_label=nsp,
        )
    ours_at = out.mlm_logits[out.mlm_labels != -100]  # (P, V) the picks, in position order
    theirs_at = theirs.prediction_logits[labels != -100]
    torch.testing.assert_close(ours_at, theirs_at, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.nsp_logits, theirs.seq_relationship_logits, atol=1e-5, rtol=0)


def test_model_learns_a_fixed_batch():
    model = BertForPreTraining(BertConfig(**TINY_MODEL, hidden_dropout_prob=0.0))
    ids = torch.randint(5, 97, (8, 16))
    labels = torch.where(torch.rand(8, 16) < 0.15, ids, -100)
    inputs = torch.where(labels != -100, 4, ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(60):
        loss = model(inputs, labels=labels, mlm_positions=picked_positions(labels)).loss
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.5 * first


def test_nothing_picked_gives_zero_loss():
    model = BertForPreTraining(BertConfig(**TINY_MODEL))
    labels = torch.full((2, 8), -100)
    out = model(torch.randint(5, 97, (2, 8)), labels=labels, mlm_positions=picked_positions(labels))
    assert out.loss.item() == 0.0
    out.loss.backward()  # still part of the graph


def test_bad_config_is_named():
    with pytest.raises(ValueError, match="num_attention_heads"):
        BertConfig(hidden_size=30, num_attention_heads=4)


def test_pretraining_flops_match_torch_flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    c = BertConfig(**TINY_MODEL)
    model = BertForPreTraining(c).train()  # attention dropout: SDPA's counted math path
    B, T = 3, 16
    ids = torch.randint(5, c.vocab_size, (B, T))
    labels = torch.where(torch.rand(B, T) < 0.2, ids, -100)
    K = int((labels != -100).sum(1).max())
    positions = picked_positions(labels, K)  # (B, K)
    with FlopCounterMode(display=False) as counter:
        out = model(
            ids,
            labels=labels,
            next_sentence_label=torch.tensor([0, 1, 1]),
            mlm_positions=positions,
        )
        forward = counter.get_total_flops()
        out.loss.backward()
    P, R = B * K, B * (1 + K)  # the head's rows, the last layer's ([CLS] too)
    assert R < B * T
    assert pretraining_flops(c, B, T, P, R, backward=False) == forward
    assert pretraining_flops(c, B, T, P, R) == counter.get_total_flops()

    # padded: the dense layers run on the real tokens alone (the unpadded encoder)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[0, 9:], mask[2, 5:] = 0, 0
    labels = torch.where(mask.bool(), labels, -100)
    K = int((labels != -100).sum(1).max())
    with FlopCounterMode(display=False) as counter:
        out = model(
            ids,
            attention_mask=mask,
            labels=labels,
            next_sentence_label=torch.zeros(3).long(),
            mlm_positions=picked_positions(labels, K),
        )
        out.loss.backward()
    P, R = B * K, B * (1 + K)
    assert pretraining_flops(c, B, T, P, R, tokens=int(mask.sum())) == counter.get_total_flops()


def test_bf16_autocast_keeps_the_residual_stream_in_bf16():
    """LayerNorm runs in the autocast dtype (CUDA's autocast would run it in fp32, and every
    block would copy its activations up and down): each layer's output stays bf16, close to
    the fp32 model's, and a LayerNorm gives fp32 statistics rounded once to bf16."""
    model = BertModel(BertConfig(**TINY_MODEL)).eval()
    ids = torch.randint(5, 97, (2, 12))
    with torch.no_grad():
        ref = model(ids, output_hidden_states=True).hidden_states
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = model(ids, output_hidden_states=True).hidden_states
            x = torch.randn(4, 32).mul(30).add(5).bfloat16()
            ln = model.encoder.layer[0].attention.output.LayerNorm(x)
    assert [h.dtype for h in low] == [torch.bfloat16] * 3
    for a, b in zip(low, ref, strict=True):
        torch.testing.assert_close(a.float(), b, atol=0.06, rtol=0.02)
    exact = F.layer_norm(x.double(), (32,), eps=1e-12).bfloat16()  # weight 1, bias 0
    torch.testing.assert_close(ln, exact, atol=0, rtol=2**-8)


def test_sinusoidal_position_init_is_the_transformer_encoding_at_bert_scale():
    table = BertModel(BertConfig(**TINY_MODEL, position_embedding_init="sinusoidal")).embeddings
    table = table.position_embeddings.weight.detach()  # (P, H)
    H, scale = table.shape[1], 0.02 * math.sqrt(2)
    assert table[5, 2].item() == pytest.approx(math.sin(5 / 10000 ** (2 / H)) * scale, abs=1e-6)
    assert table[5, 3].item() == pytest.approx(math.cos(5 / 10000 ** (2 / H)) * scale, abs=1e-6)
    assert table.pow(2).mean().sqrt().item() == pytest.approx(0.02)  # BERT's init's scale
    # neighbours alike, distant positions less so: the structure random vectors lack
    near = F.cosine_similarity(table[10], table[11], dim=0)
    assert near > F.cosine_similarity(table[10], table[40], dim=0) + 0.2
    with pytest.raises(ValueError, match="position_embedding_init='rope'; expected normal or"):
        BertConfig(**TINY_MODEL, position_embedding_init="rope")
