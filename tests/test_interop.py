from dataclasses import asdict

import pytest
import torch

from bert_lightning.checkpoint import load_hf_folder, read_checkpoint
from bert_lightning.data.tokenizer import SPECIAL_TOKENS
from bert_lightning.errors import UserError
from bert_lightning.interop import hf_to_ours, load_into, ours_to_hf
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.tasks.kinds import hf_head
from helpers import TINY_BERT

transformers = pytest.importorskip("transformers")

TINY = dict(TINY_BERT, vocab_size=40, max_position_embeddings=64)


def hf_folder(tmp_path, legacy=False):
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY)).eval()
    hf.save_pretrained(tmp_path)
    words = SPECIAL_TOKENS + [chr(ord("a") + i) for i in range(26)] + [f"##{i}" for i in range(9)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    if legacy:  # an old TF-converted checkpoint: gamma/beta, .bin
        from safetensors.torch import load_file

        state = load_file(tmp_path / "model.safetensors")
        state = {k.replace("LayerNorm.weight", "LayerNorm.gamma"): v for k, v in state.items()}
        state = {k.replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in state.items()}
        (tmp_path / "model.safetensors").unlink()
        torch.save(state, tmp_path / "pytorch_model.bin")
    return hf


@pytest.mark.parametrize("legacy", [False, True])
def test_import_hf_folder_gives_same_logits(tmp_path, legacy):
    hf = hf_folder(tmp_path, legacy)
    ckpt = load_hf_folder(tmp_path)
    ours = BertForPreTraining(ckpt.config).eval()
    load_into(ours, ckpt.state_dict)
    ids = torch.randint(5, 40, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    labels = torch.where(mask.bool(), ids, -100)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask)
        out = ours(ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(
        out.mlm_logits[out.mlm_labels != -100],
        theirs.prediction_logits[mask.bool()],
        atol=1e-5,
        rtol=0,
    )
    assert ckpt.tokenizer.token_to_id("a") == 5


def test_key_map_round_trip(tmp_path):
    from safetensors.torch import load_file

    state = BertForPreTraining(BertConfig(**TINY)).state_dict()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
    hf.save_pretrained(tmp_path)
    assert set(ours_to_hf(state)) == set(load_file(tmp_path / "model.safetensors"))
    assert set(hf_to_ours(ours_to_hf(state))) == set(state) - {"cls.predictions.decoder.weight"}


def test_fused_qkv_splits_and_joins_exactly():
    """`qkv`'s row blocks are HF's query, key and value, and the map is lossless both ways."""
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY)).state_dict()
    ours = hf_to_ours(hf)
    layer = "bert.encoder.layer.1.attention.self"
    assert f"{layer}.query.weight" not in ours and ours[f"{layer}.qkv.weight"].shape == (96, 32)
    assert torch.equal(ours[f"{layer}.qkv.weight"][32:64], hf[f"{layer}.key.weight"])
    back = ours_to_hf(ours)
    assert set(back) == set(hf) - {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert all(torch.equal(back[k], hf[k]) for k in back)
    partial = {k: v for k, v in hf.items() if not k.startswith(f"{layer}.value")}
    with pytest.raises(UserError, match=f"{layer}.query.weight: the checkpoint lacks its key"):
        hf_to_ours(partial)


def test_load_into_refuses_misfits():
    model = BertForPreTraining(BertConfig(**TINY))
    with pytest.raises(KeyError, match="classifier.weight"):
        load_into(model, {"classifier.weight": torch.zeros(2, 32)})
    with pytest.raises(ValueError, match="cls.predictions.bias"):
        load_into(model, {"cls.predictions.bias": torch.zeros(7)})


def test_a_checkpoint_of_ours_with_three_projections_still_reads(tmp_path, tiny_tokenizer):
    """A `.ckpt` written when query, key and value were apart reads into `qkv` unchanged."""
    config = BertConfig(**TINY | {"vocab_size": tiny_tokenizer.get_vocab_size()})
    state = BertForPreTraining(config).state_dict()
    tied = "cls.predictions.decoder.weight"
    old = ours_to_hf(state) | {tied: state[tied]}  # as Lightning saved it
    ckpt = {
        "hyper_parameters": {"config": asdict(config)},
        "state_dict": {f"model.{k}": v for k, v in old.items()},
        "tokenizer": tiny_tokenizer.to_str(),
    }
    torch.save(ckpt, tmp_path / "old.ckpt")
    read = read_checkpoint(tmp_path / "old.ckpt").state_dict
    key = "bert.encoder.layer.0.attention.self.qkv.weight"
    assert torch.equal(read[key], state[key]) and "query" not in " ".join(read)


def test_export_asks_the_task_for_its_head():
    """interop maps keys; which transformers class a fine-tuned head is (and whether there is
    one) its task says, from the config a checkpoint stores."""
    seq, token = "BertForSequenceClassification", "BertForTokenClassification"
    assert hf_head({"kind": "regression", "pooling": "cls"}) == (seq, "regression")
    assert hf_head({"kind": "token_classification"}) == (token, "single_label_classification")
    assert hf_head({"kind": "ad_relevance", "architecture": "cross_encoder"}) == (seq, None)
    with pytest.raises(UserError, match=r"^task.architecture=bi_encoder: no transformers class$"):
        hf_head({"kind": "ad_relevance", "architecture": "bi_encoder", "pooling": "mean"})
