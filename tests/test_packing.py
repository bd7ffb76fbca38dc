"""Packing without cross-document attention (`data.packing=packed_isolated`): position ids that
restart at 0 mark documents, and each attends to itself alone, so a packed document computes
what it would alone."""

import pytest
import torch

from bert_lightning.data.masking import document_positions, picked_positions
from bert_lightning.model import BertConfig, BertForPreTraining, BertModel
from helpers import TINY_NO_DROPOUT

LENGTHS = [7, 5, 9]  # the documents of row 0; row 1 is one document and, padded, 4 pads


def packed_batch(padded: bool):
    """(2, 21) ids: row 0 three documents, each starting with [CLS] (2); row 1 one document."""
    T = sum(LENGTHS)
    ids = torch.randint(5, 97, (2, T), generator=torch.Generator().manual_seed(0))
    starts = torch.zeros(2, T, dtype=torch.bool)
    for s in torch.tensor([0, *LENGTHS[:-1]]).cumsum(0):
        starts[0, s] = True
    ids[starts] = 2
    ids[1, 0] = 2
    mask = None
    if padded:
        mask = torch.ones_like(ids)
        mask[1, T - 4 :] = 0
        ids = ids * mask
    return ids, document_positions(ids == 2), mask


@pytest.mark.parametrize(("pre_ln", "padded"), [(False, False), (False, True), (True, True)])
def test_a_packed_document_computes_what_it_computes_alone(pre_ln, padded):
    model = BertModel(BertConfig(**TINY_NO_DROPOUT, pre_layer_norm=pre_ln)).eval()
    ids, pos, mask = packed_batch(padded)
    assert pos[0].tolist() == [*range(7), *range(5), *range(9)]
    with torch.no_grad():
        packed = model(ids, attention_mask=mask, position_ids=pos).last_hidden_state  # (2, T, H)
        start = 0
        for n in LENGTHS:
            alone = model(ids[:1, start : start + n]).last_hidden_state  # (1, n, H)
            torch.testing.assert_close(packed[:1, start : start + n], alone, atol=1e-5, rtol=0)
            start += n
        across = model(ids, attention_mask=mask).last_hidden_state  # plain packing
    assert (across[0, :7] - packed[0, :7]).abs().max() > 1e-3  # which does attend across


def test_a_tokens_mlm_logits_do_not_change_with_another_document():
    """The pretraining path (sparse MLM head, last layer on the picked rows) keeps it too."""
    model = BertForPreTraining(BertConfig(**TINY_NO_DROPOUT)).eval()
    ids, pos, mask = packed_batch(padded=True)
    labels = torch.full_like(ids, -100)
    labels[:, 1::3] = ids[:, 1::3]
    labels[ids < 5] = -100
    changed = ids.clone()
    changed[0, 8:12] = torch.tensor([50, 51, 52, 53])  # inside the second document
    with torch.no_grad():
        positions = picked_positions(labels)  # (B, T)
        a, b = (
            model(x, attention_mask=mask, labels=labels, mlm_positions=positions, position_ids=pos)
            for x in (ids, changed)
        )
        a, b = (out.mlm_logits[out.mlm_labels != -100] for out in (a, b))  # (P, V) each
    first, third = labels[0, :7] != -100, labels[0, 12:] != -100
    n1, n2 = int(first.sum()), int((labels[0, :12] != -100).sum())
    assert n1 and int(third.sum())
    torch.testing.assert_close(a[:n1], b[:n1], atol=1e-5, rtol=0)
    k = int((labels[0] != -100).sum())
    torch.testing.assert_close(a[n2:k], b[n2:k], atol=1e-5, rtol=0)
    assert (a[n1:n2] - b[n1:n2]).abs().max() > 1e-3  # the changed document's own do change
