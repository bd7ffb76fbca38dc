"""The optimizer's parameter groups (fused AdamW, decay on matrices only, head and layer-wise
rates) and the FLOP counts behind MFU."""

import re

import torch
from hydra.utils import instantiate

from bert_lightning.data.masking import picked_positions
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.training.callbacks import device_peak_flops
from helpers import OPTIM

SMALL = BertConfig(
    vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
)


def test_adamw_is_fused_and_decays_matrices_only():
    model = BertForPreTraining(SMALL)
    opt = instantiate(OPTIM, weight_decay=0.1)(model, run_steps=10)["optimizer"]
    assert opt.defaults["fused"]  # the CPU has a fused AdamW since torch 2.4
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decay["params"]) and all(
        p.ndim == 1 for p in no_decay["params"]
    )
    before = model.bert.pooler.dense.weight.detach().clone()
    labels = torch.randint(5, 50, (2, 8))
    model(
        torch.randint(5, 50, (2, 8)),
        labels=labels,
        mlm_positions=picked_positions(labels),
        next_sentence_label=torch.tensor([0, 1]),
    ).loss.backward()
    opt.step()
    assert not torch.equal(before, model.bert.pooler.dense.weight)


def test_head_lr_is_the_rate_of_what_is_outside_the_encoder():
    from bert_lightning.model.heads import BertBiEncoder

    model = BertBiEncoder(SMALL, "mean")
    built = instantiate(OPTIM, lr=1e-3, head_lr=0.1, warmup_steps=2)(model, run_steps=10)
    groups = built["optimizer"].param_groups
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [
        (1e-3 / 2, 0.01),
        (1e-3 / 2, 0.0),
        (0.1 / 2, 0.01),
        (0.1 / 2, 0.0),  # warmup step 0
    ]
    head = [p for g in groups[2:] for p in g["params"]]
    assert [id(p) for p in head] == [id(model.classifier.weight), id(model.classifier.bias)]
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    built["lr_scheduler"]["scheduler"].step()
    assert [g["lr"] for g in groups] == [1e-3, 1e-3, 0.1, 0.1]  # one schedule, two rates


def test_layer_decay_gives_each_layer_the_factors_power():
    """Of L = 3 layers: layer i at lr x 0.5^(3 - i), the embeddings at 0.5^4, the pooler and a
    head without a rate of its own at lr; 1.0 leaves today's two groups."""
    from bert_lightning.model.heads import BertBiEncoder

    config = BertConfig(**{**SMALL.__dict__, "num_hidden_layers": 3})
    model = BertBiEncoder(config, "mean")
    build = instantiate(OPTIM, lr=0.8, warmup_steps=0, layer_decay=0.5)
    groups = build(model, run_steps=10)["optimizer"].param_groups
    rates = {g["name"]: g["lr"] for g in groups}
    assert rates == {
        "model": 0.8, "model_no_decay": 0.8,
        "model_layer2": 0.4, "model_layer2_no_decay": 0.4,
        "model_layer1": 0.2, "model_layer1_no_decay": 0.2,
        "model_layer0": 0.1, "model_layer0_no_decay": 0.1,
        "model_embeddings": 0.05, "model_embeddings_no_decay": 0.05,
    }  # fmt: skip
    named = {id(p): n for n, p in model.named_parameters()}
    for g in groups:
        for p in g["params"]:
            n = named[id(p)]
            where = re.match(r"bert\.(?:encoder\.layer\.(\d)|(embeddings))\.", n)
            want = "" if where is None else f"_layer{where[1]}" if where[1] else "_embeddings"
            assert g["name"].removesuffix("_no_decay") == "model" + want, n
            assert (g["weight_decay"] > 0) == (p.ndim >= 2), n
    assert sum(len(g["params"]) for g in groups) == len(list(model.parameters()))
    with_head = instantiate(OPTIM, lr=0.8, warmup_steps=0, layer_decay=0.5, head_lr=0.3)
    groups = with_head(model, run_steps=10)["optimizer"].param_groups
    assert [(g["name"], g["lr"]) for g in groups if "head" in g["name"]] == [
        ("head", 0.3), ("head_no_decay", 0.3)
    ]  # fmt: skip
    assert {g["name"]: g["lr"] for g in groups}["encoder_layer0"] == 0.1
    plain = instantiate(OPTIM)(model, run_steps=10)["optimizer"].param_groups
    assert [g["name"] for g in plain] == ["model", "model_no_decay"]


def test_no_peak_flops_where_unknown():
    # a CPU has no table entry: MFU is omitted, not invented
    assert device_peak_flops("cpu", "bf16-mixed") is None
    assert device_peak_flops(torch.device("cpu"), "32-true") is None


def test_flops_per_batch_stays_on_the_device_and_equals_the_formula():
    from bert_lightning.model import pretraining_flops
    from bert_lightning.training.pretrain_module import BertPretrainModule

    config = dict(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)
    module = BertPretrainModule(config, OPTIM, nsp=False)
    labels = torch.full((3, 10), -100)
    labels[0, [2, 5]] = 7
    labels[2, [1, 3, 4, 9]] = 8  # row 1 has none
    positions = torch.zeros(3, 5, dtype=torch.long)  # K = 5: the last layer's rows 3 x (1 + 5)
    batch = {"input_ids": torch.randint(5, 50, (3, 10)), "labels": labels}
    got = module.flops_per_batch(batch | {"mlm_positions": positions})
    expected = pretraining_flops(module.model.config, 3, 10, 6, 3 * 6)  # the 6 picks counted
    assert isinstance(got, torch.Tensor) and int(got) == expected


def test_pretraining_with_head_lr_zero_moves_the_encoder_only(tmp_path):
    """`optim.head_lr` in a pretraining run: at rate 0 the MLM head stays as initialised
    (LayerNorm 1, biases 0) while the encoder's LayerNorms and biases move."""
    from bert_lightning.config import compose
    from bert_lightning.training.pretrain import train
    from helpers import tiny_overrides, write_corpus

    write_corpus(tmp_path / "corpus.jsonl", 20)
    over = ["trainer.max_steps=3", "validate_before_fit=false", "optim.warmup_steps=0"]
    train(compose(overrides=tiny_overrides(tmp_path, *over, "optim.head_lr=0")))
    ckpt = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert [g["initial_lr"] for g in ckpt["optimizer_states"][0]["param_groups"]] == [
        1e-3,
        1e-3,
        0.0,
        0.0,
    ]
    state = ckpt["state_dict"]
    head = "model.cls.predictions."
    assert torch.equal(state[head + "transform.LayerNorm.weight"], torch.ones(32))
    for name in ("bias", "transform.LayerNorm.bias", "transform.dense.bias"):
        assert not state[head + name].any(), name
    assert not torch.equal(state["model.bert.embeddings.LayerNorm.weight"], torch.ones(32))
    assert state["model.bert.encoder.layer.1.output.dense.bias"].any()
