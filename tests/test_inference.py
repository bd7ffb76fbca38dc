"""`bert_lightning.inference`: each load kind holds every weight its checkpoint has for it, and
the batched loops give what one text at a time, unpadded, gives."""

import logging

import pytest
import torch

from bert_lightning.data.masking import picked_positions
from bert_lightning.errors import UserError
from bert_lightning.inference import (
    embed_texts,
    fill_masks,
    load_embedder,
    load_finetuned,
    load_mlm,
    unmaskable,
)
from finetune_fixtures import relevance_ckpt, write_hf_folder, write_our_ckpt, write_tokenizer

MASKED = ["the [MASK] was [MASK]", "a lovely [MASK] was the plot of the show", "bob [MASK]"]


@pytest.fixture
def tok(tmp_path):
    return write_tokenizer(tmp_path / "tokenizer.json")


def test_load_mlm_holds_every_weight_of_a_pretraining_checkpoint(tmp_path, tok):
    """NSP head included: the model the brackets suite evaluates, as a strict load gives it."""
    state = write_our_ckpt(tmp_path / "pre.ckpt", tok)
    model, _ = load_mlm(tmp_path / "pre.ckpt")
    got = model.state_dict()
    assert set(got) == set(state) and all(torch.equal(got[k], v) for k, v in state.items())
    assert not model.training


def test_fill_masks_of_a_padded_batch_are_those_of_each_text_alone(tmp_path, tok):
    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    model, tok = load_mlm(tmp_path / "pre.ckpt")
    encodings = tok.encode_batch(MASKED)
    batched = fill_masks(model, tok, encodings, top_k=3)
    for enc, masks in zip(encodings, batched, strict=True):
        ids = torch.tensor([enc.ids])  # (1, T)
        picked = ids == tok.token_to_id("[MASK]")
        with torch.no_grad():
            labels = torch.where(picked, ids, -100)
            out = model(ids, labels=labels, mlm_positions=picked_positions(labels))
            probs = out.mlm_logits[out.mlm_labels != -100].softmax(-1)  # (M, V)
        top = probs.topk(3)  # (M, 3)
        assert [[e["token"] for e in m] for m in masks] == [
            [tok.id_to_token(i) for i in row] for row in top.indices.tolist()
        ]
        for m, p in zip(masks, top.values.tolist(), strict=True):
            assert [e["prob"] for e in m] == pytest.approx(p, abs=1e-6)


def test_unmaskable_names_the_first_text_the_model_cannot_read(tmp_path, tok):
    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    model, tok = load_mlm(tmp_path / "pre.ckpt")
    long = " ".join(["the film"] * 40) + " [MASK]"  # 64 positions
    texts = [MASKED[0], "no mask", long]
    assert unmaskable(model, tok, texts, tok.encode_batch(texts)) == "no [MASK] in 'no mask'"
    n = len(tok.encode(long).ids)
    why = unmaskable(model, tok, texts[::2], tok.encode_batch(texts[::2]))
    assert why == f"{n} word pieces; the model reads at most 64"
    write_hf_folder(tmp_path / "hf", tok)
    with pytest.raises(UserError, match="hf: no MLM head .* fill-mask needs one"):
        load_mlm(tmp_path / "hf")


def test_the_embedder_truncates_to_the_positions_the_model_has(tmp_path, tok):
    """--max-seq-length 512 on a model of 64 positions: 64 word pieces, not an error."""
    write_hf_folder(tmp_path / "hf", tok)
    model, short = load_embedder(tmp_path / "hf", max_seq_length=512)
    long = " ".join(["the film"] * 40)
    assert len(short.encode(long).ids) == model.config.max_position_embeddings == 64
    assert embed_texts(model, short, [long, "bob"], "mean").shape == (2, 32)


def test_a_checkpoint_from_before_a_task_key_loads_with_its_shipped_value(tmp_path, tok, caplog):
    """A fine-tuned checkpoint written before `task.contrastive_*` existed loads with the
    shipped values (the behaviour it was trained with) and says so; a key no task has is
    still an error."""
    path, _ = relevance_ckpt(tmp_path, tok)
    raw = torch.load(path, weights_only=True)
    for key in ("contrastive_weight", "contrastive_scale", "contrastive_min"):
        del raw["hyper_parameters"]["task"][key]
    torch.save(raw, path)
    with caplog.at_level(logging.INFO):
        ft = load_finetuned(path)
    assert (ft.task.cfg.contrastive_weight, ft.task.cfg.contrastive_scale) == (0.0, 20.0)
    assert "['contrastive_min', 'contrastive_scale', 'contrastive_weight']" in caplog.text
    raw["hyper_parameters"]["task"]["contrastive_wieght"] = 1.0
    torch.save(raw, path)
    with pytest.raises(UserError, match=r"task: unknown key\(s\) \['contrastive_wieght'\]"):
        load_finetuned(path)
