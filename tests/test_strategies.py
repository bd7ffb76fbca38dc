"""The scale-out options of the `trainer` group and `model_compile`, checked without GPUs."""

import csv
import json
import logging

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.strategies import StrategyRegistry

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.errors import UserError
from bert_lightning.interop import export_hf_folder
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.strategies import FSDP2Strategy
from helpers import OPTIM


def test_fsdp_config_is_fsdp2_with_full_state_checkpoints(tmp_path):
    cfg = compose(overrides=["trainer=fsdp", "trainer.num_nodes=2", f"paths.output_dir={tmp_path}"])
    trainer = instantiate(cfg.trainer, accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, FSDP2Strategy)
    assert trainer.strategy._save_distributed_checkpoint is False  # one portable file
    assert trainer.num_nodes == 2 and trainer.num_devices == 2


def test_deepspeed_config_is_zero_stage_2(tmp_path):
    cfg = compose(overrides=["trainer=deepspeed", f"paths.output_dir={tmp_path}"])
    assert StrategyRegistry[cfg.trainer.strategy]["init_params"]["stage"] == 2
    assert cfg.trainer.accelerator == "gpu"  # Lightning's DeepSpeed strategy needs CUDA


def test_model_compile_keeps_checkpoint_keys(tmp_path):
    import lightning as L

    config = dict(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2)
    module = BertPretrainModule(config, OPTIM, nsp=False, compile=True)
    module.trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False)
    keys = list(module.state_dict())
    module.configure_model()
    module.configure_model()  # Lightning calls it before validate and again before fit
    assert module.model._compiled_call_impl is not None
    assert list(module.state_dict()) == keys  # no `_orig_mod.`: checkpoints stay portable


@pytest.mark.slow
def test_a_compiled_run_takes_steps_as_the_eager_one(tmp_path):
    """`model_compile=true` on the CPU (inductor): 4 steps of the tiny run, the losses those of
    the eager run (same seed, same batches; no dropout, whose draws inductor makes its own
    way) within 1e-3."""
    from helpers import pretrain_tiny

    def losses(name: str, *extra: str) -> list[float]:
        no_dropout = ("model.hidden_dropout_prob=0", "model.attention_probs_dropout_prob=0")
        pretrain_tiny(tmp_path / name, "trainer.max_steps=4", *no_dropout, *extra)
        with open(tmp_path / name / "metrics.csv") as f:
            return [float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]]

    eager, compiled = losses("eager"), losses("compiled", "model_compile=true")
    assert len(compiled) == 4 and compiled == pytest.approx(eager, abs=1e-3)


def test_model_compile_modes():
    """auto: compiled on a GPU, eager on a CPU; true: torch.compile's default mode; a mode
    by name; anything else one line."""
    from bert_lightning.training.module_base import compile_mode

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert [compile_mode(s, cpu) for s in ("auto", True, False)] == [None, "default", None]
    assert compile_mode("auto", gpu) == "default"
    assert compile_mode("reduce-overhead", cpu) == "reduce-overhead"
    with pytest.raises(UserError, match=r"model_compile='fast'; expected true, false, auto"):
        compile_mode("fast", gpu)


@pytest.mark.slow
def test_bf16_true_run_exports_bf16_weights(tmp_path):
    from helpers import pretrain_tiny

    transformers = pytest.importorskip("transformers")
    pretrain_tiny(tmp_path / "run", "trainer.precision=bf16-true", "trainer.max_steps=2")
    ckpt = read_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert ckpt.state_dict["bert.embeddings.word_embeddings.weight"].dtype == torch.bfloat16
    out = export_hf_folder(ckpt.state_dict, ckpt.config, ckpt.tokenizer, tmp_path / "hf")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    hf = transformers.BertForPreTraining.from_pretrained(out, dtype="auto")
    assert hf.dtype == torch.bfloat16


def test_several_devices_by_default_get_plain_ddp_with_frozen_unused_heads(tmp_path):
    """`trainer.devices=8` alone: Lightning's plain DDP; an MLM-only run freezes the pooler and
    NSP head (no gradient there), so DDP finds no unused parameters."""
    from bert_lightning.training.pretrain import build
    from helpers import tiny_overrides, write_corpus

    write_corpus(tmp_path / "corpus.jsonl")
    _, module, trainer = build(compose(overrides=tiny_overrides(tmp_path, "trainer.devices=2")))
    assert trainer.num_devices == 2
    assert not trainer.strategy._ddp_kwargs.get("find_unused_parameters", False)
    frozen = [n for n, p in module.named_parameters() if not p.requires_grad]
    assert frozen and all("pooler" in n or "seq_relationship" in n for n in frozen)


@pytest.mark.parametrize(("caps", "warned"), [({}, True), ({"avx512_bf16": True}, False)])
def test_bf16_on_a_cpu_without_bf16_instructions_says_so(
    tmp_path, monkeypatch, caplog, caps, warned
):
    """Emulated bf16 is several times slower than fp32 on such a CPU: one line says so."""
    from bert_lightning.training.trainer import build_trainer

    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: caps)
    cfg = compose(overrides=[f"paths.output_dir={tmp_path}", "trainer.precision=bf16-mixed"])
    with caplog.at_level("WARNING"):
        build_trainer(cfg)
    message = (
        "trainer.precision=bf16-mixed on a CPU without bf16 instructions (no avx512_bf16, no "
        "AMX): emulated, several times slower than trainer.precision=32-true here"
    )
    assert (message in caplog.messages) == warned


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for a machine without GPUs")
def test_the_cards_eight_gpu_command_without_gpus_says_what_runs_instead(tmp_path, caplog):
    from bert_lightning.training.trainer import build_trainer

    cfg = compose(
        overrides=["model=bert_base", "trainer.devices=8", f"paths.output_dir={tmp_path}"]
    )
    with caplog.at_level(logging.WARNING):
        build_trainer(cfg)
    assert (
        "no GPU found: trainer.devices=8 runs 8 CPU processes, precision 32-true, 600 steps at "
        "lr 0.001 (the schedule of the config given; BERT-base's recipe on C4: "
        "experiment=bert_base_c4; a CPU recipe: experiment=cpu_30min)"
    ) in caplog.text
    caplog.clear()
    build_trainer(compose(overrides=["trainer.devices=1", f"paths.output_dir={tmp_path}"]))
    assert "no GPU found" not in caplog.text
