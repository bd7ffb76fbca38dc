"""The unpadded encoder (the forward's `unpad`, on by default): a padded batch runs its Linears,
LayerNorms and dropout on the real tokens alone; every output a head reads, the losses and the
gradients equal the padded path's. A captured graph (torch.compile) runs the padded path."""

import pytest
import torch

from bert_lightning.data.masking import picked_positions
from bert_lightning.model import BertConfig, BertForPreTraining, BertModel
from bert_lightning.model.bert import Unpadded
from bert_lightning.model.heads import (
    BertBiEncoder,
    BertForSequenceClassification,
    BertForTokenClassification,
)
from helpers import TINY_NO_DROPOUT


def ragged_batch(B: int = 5, T: int = 19, seed: int = 0):
    """Rows of lengths 3..T, one of them full: [CLS] tokens [SEP] then padding, two segments."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, 3, 11, 7, 16][:B])
    mask = (torch.arange(T) < lengths[:, None]).long()  # (B, T)
    ids = torch.randint(5, 97, (B, T), generator=g) * mask  # (B, T), 0 = [PAD]
    types = ((torch.arange(T) >= lengths[:, None] // 2) & mask.bool()).long()  # (B, T)
    return ids, types, mask


def both(fn):
    """fn(unpad) on the padded path, then on the unpadded one, from the same weights."""
    results = []
    for unpad in (False, True):
        torch.manual_seed(0)
        results.append(fn(unpad))
    return results


def grads(model) -> dict:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize(
    ("pre_ln", "causal"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_encoder_outputs_at_real_tokens_equal_the_padded_path(pre_ln, causal):
    model = BertModel(
        BertConfig(**TINY_NO_DROPOUT, pre_layer_norm=pre_ln, is_decoder=causal)
    ).eval()
    ids, types, mask = ragged_batch()
    padded, unpadded = both(
        lambda unpad: model(ids, types, mask, output_hidden_states=True, unpad=unpad)
    )
    real = mask.bool()
    torch.testing.assert_close(
        unpadded.last_hidden_state[real], padded.last_hidden_state[real], atol=1e-5, rtol=0
    )
    torch.testing.assert_close(unpadded.pooler_output, padded.pooler_output, atol=1e-5, rtol=0)
    for a, b in zip(unpadded.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(a[real], b[real], atol=1e-5, rtol=0)
    assert unpadded.last_hidden_state[~real].abs().max() == 0  # pads are not computed


@pytest.mark.parametrize("pre_ln", [False, True])
def test_pretraining_losses_logits_and_gradients_equal_the_padded_path(pre_ln):
    """MLM (sparse head, last layer on the picked rows) and NSP, forward and backward (dropout
    off: the two paths draw their masks over tensors of different shapes)."""
    model = BertForPreTraining(BertConfig(**TINY_NO_DROPOUT, pre_layer_norm=pre_ln))
    ids, types, mask = ragged_batch()
    labels = torch.where((torch.rand(ids.shape) < 0.3) & mask.bool(), ids, -100)
    nsp = torch.tensor([0, 1, 0, 1, 1])

    def step(unpad):
        model.zero_grad()
        out = model(
            ids,
            types,
            mask,
            labels=labels,
            mlm_positions=picked_positions(labels),
            next_sentence_label=nsp,
            unpad=unpad,
        )
        out.loss.backward()
        return out, grads(model)

    (a, ga), (b, gb) = both(step)
    for x, y in [(a.mlm_loss, b.mlm_loss), (a.nsp_loss, b.nsp_loss)]:
        torch.testing.assert_close(y, x, atol=1e-5, rtol=0)
    at = a.mlm_labels != -100  # the picks (the rest of the (B x K) rows: no prediction)
    torch.testing.assert_close(b.mlm_logits[at], a.mlm_logits[at], atol=1e-5, rtol=0)
    assert ga.keys() == gb.keys()
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize(
    "make",
    [
        lambda c: BertForSequenceClassification(c, 3, pooling="cls"),
        lambda c: BertForSequenceClassification(c, 1, pooling="mean"),
        lambda c: BertForTokenClassification(c, 5),
        lambda c: BertBiEncoder(c, "mean"),
    ],
    ids=["sequence-cls", "regression-mean", "token", "bi-encoder"],
)
def test_fine_tuning_heads_equal_the_padded_path(make):
    model = make(BertConfig(**TINY_NO_DROPOUT))
    ids, types, mask = ragged_batch()

    def step(unpad):
        model.zero_grad()
        out = model(ids, types, mask, unpad=unpad)  # (B, ...) or (B, T, labels)
        (out[mask.bool()] if out.dim() == 3 else out).float().pow(2).sum().backward()
        return out, grads(model)

    (a, ga), (b, gb) = both(step)
    real = mask.bool()
    torch.testing.assert_close(
        b[real] if b.dim() == 3 else b, a[real] if a.dim() == 3 else a, atol=1e-5, rtol=0
    )
    for n in ga:
        torch.testing.assert_close(gb[n], ga[n], atol=1e-5, rtol=1e-4, msg=n)


def test_the_mask_decides_the_path_without_being_read(monkeypatch):
    """No mask (packed blocks): the padded path, nothing to remove. A mask (the data pad their
    rows) unpads, even where a batch happens to need none: reading the mask to find out would
    make the host wait for the device on every step."""
    model = BertModel(BertConfig(**TINY_NO_DROPOUT)).eval()
    ids, types, mask = ragged_batch()
    calls, of = [], Unpadded.of
    monkeypatch.setattr(Unpadded, "of", lambda m: calls.append(m) or of(m))
    model(ids, types)
    assert calls == []
    full = model(ids, types, torch.ones_like(mask)).last_hidden_state
    model(ids, types, mask)
    assert len(calls) == 2
    torch.testing.assert_close(full, model(ids, types).last_hidden_state, atol=1e-5, rtol=0)


def test_a_captured_graph_runs_padded_batches_padded(monkeypatch):
    """torch.compile (as `model_compile` runs a step) and the ONNX tracer capture one graph for
    every batch: no shape there may depend on how many tokens are real, so a padded batch runs
    the padded path (`fullgraph=True`: unpadding's read would break the graph)."""
    model = BertModel(BertConfig(**TINY_NO_DROPOUT)).eval()
    ids, types, mask = ragged_batch()
    calls, of = [], Unpadded.of
    monkeypatch.setattr(Unpadded, "of", lambda m: calls.append(m) or of(m))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    out = compiled(ids, types, mask).last_hidden_state  # (B, T, H)
    assert calls == []
    padded = model(ids, types, mask, unpad=False).last_hidden_state  # (B, T, H)
    torch.testing.assert_close(out, padded, atol=1e-5, rtol=0)
