"""Every trainer preset x precision takes optimizer steps with gradient clipping on (see
run_matrix.py): a combination users run that no test steps is a bug waiting (bf16-mixed with
a fused AdamW and clipping once stopped every GPU run at its first step)."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from run_matrix import (
    CLIP,
    JOBS,
    MULTI,
    PRECISIONS,
    REFUSED,
    REPEATS,
    SINGLE,
    STEPS,
    case_config,
    case_dir,
    run_case,
)

from bert_lightning.data.masking import picked_positions
from helpers import ROOT, run_in_session, subprocess_env


def assert_clipped_steps(out: Path, ranks: int, log: str = "") -> None:
    probes = sorted(out.glob("grads-rank*.json"))
    assert len(probes) == ranks, f"{out.name}: {len(probes)} of {ranks} ranks reported\n{log}"
    for path in probes:
        p = json.loads(path.read_text())
        assert p["global_step"] == STEPS and len(p["steps"]) == STEPS, (out.name, p)
        for s in p["steps"]:
            assert math.isfinite(s["loss"]), (out.name, s)
            assert s["before_clip"] > CLIP, (out.name, s)  # there was something to clip
            assert s["after_clip"] <= CLIP * 1.02, (out.name, s)  # and it was clipped


@pytest.mark.slow
def test_no_two_cases_run_the_same_config(tmp_path):
    """Each case composes a config of its own (all in one folder, to compare the rest), and a
    preset left out as another's repeat (REPEATS) composes exactly that other's config."""

    def composed(preset, precision, job, accelerator="cpu"):
        return OmegaConf.to_yaml(case_config(preset, precision, job, tmp_path, accelerator))

    cases = [(p, prec, job) for p in [*SINGLE, *MULTI] for prec in PRECISIONS for job in JOBS]
    cases += [("deepspeed", "bf16-mixed", job, "gpu") for job in JOBS]
    configs = {}
    for case in cases:
        configs.setdefault(composed(*case), []).append(case)
    assert len(configs) == len(cases), [c for c in configs.values() if len(c) > 1]
    for preset, same in REPEATS.items():
        for precision in PRECISIONS:
            for job in JOBS:
                assert composed(preset, precision, job) == composed(same, precision, job), preset


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("preset", SINGLE)
def test_single_process_preset_steps_with_clipping(tmp_path, preset, precision):
    for job in JOBS:
        out = case_dir(tmp_path, preset, precision, job)
        run_case(preset, precision, job, out)
        assert_clipped_steps(out, ranks=1)


@pytest.fixture(scope="module")
def multi_launch(tmp_path_factory):
    """One 2-process torchrun launch runs every multi-process case (gloo on the CPU)."""
    root = tmp_path_factory.mktemp("matrix")
    env = subprocess_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    r = run_in_session([*cmd, str(ROOT / "tests" / "run_matrix.py"), str(root)], env, 900, root)
    # each case asserts its own probes; the launcher's exit code alone would hide which failed
    return root, r.stderr[-4000:]


@pytest.mark.slow
@pytest.mark.parametrize("job", JOBS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("preset", MULTI)
def test_multi_process_preset_steps_with_clipping(multi_launch, preset, precision, job):
    if (preset, job) in REFUSED:
        pytest.skip(f"objective={job} refuses trainer={preset} (tests/test_distill.py)")
    root, log = multi_launch
    assert_clipped_steps(case_dir(root, preset, precision, job), ranks=2, log=log)


@pytest.mark.slow
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("deepspeed") is None,
    reason="trainer=deepspeed: Lightning's DeepSpeed strategy needs CUDA and the deepspeed extra",
)
def test_deepspeed_preset_steps_with_clipping(tmp_path):
    for job in JOBS:
        out = case_dir(tmp_path, "deepspeed", "bf16-mixed", job)
        run_case("deepspeed", "bf16-mixed", job, out, accelerator="gpu")
        assert_clipped_steps(out, ranks=1)


def test_fp16_scaler_unscales_before_clipping_with_a_non_fused_adamw(tmp_path):
    """16-mixed: the gradients are scaled, so the AdamW is not fused (Lightning unscales only
    for an optimizer that does not unscale itself) and clipping sees the true gradients.
    A CPU gets the scaler explicitly: Lightning turns `precision=16-mixed` into bf16 there."""
    import lightning as L
    from lightning.pytorch.plugins.precision import MixedPrecision

    from bert_lightning.training.pretrain_module import BertPretrainModule
    from helpers import OPTIM
    from probe import GradProbe

    config = dict(vocab_size=60, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    module = BertPretrainModule({**config, "intermediate_size": 32}, OPTIM, nsp=False)
    ids = torch.randint(5, 60, (8, 12), generator=torch.Generator().manual_seed(0))  # (B, T)
    labels = torch.full_like(ids, -100)
    labels[:, 3] = ids[:, 3]
    positions = picked_positions(labels, 1)  # (8, 1): the collator's
    rows = [
        {"input_ids": i, "labels": y, "mlm_positions": p}
        for i, y, p in zip(ids, labels, positions, strict=True)
    ]
    scale = 1024.0
    probe = GradProbe()
    trainer = L.Trainer(
        accelerator="cpu",
        plugins=[MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu", scale))],
        max_steps=STEPS,
        gradient_clip_val=CLIP,
        callbacks=[probe],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, torch.utils.data.DataLoader(rows, batch_size=4))
    assert not trainer.optimizers[0].defaults["fused"]
    assert trainer.global_step == STEPS and len(probe.steps) == STEPS
    for s in probe.steps:
        assert CLIP < s["before_clip"] < scale  # unscaled before the clip (scaled: ~1,000x)
        assert s["after_clip"] <= CLIP * 1.02


def test_bf16_mixed_keeps_the_fused_adamw(tmp_path):
    out = case_dir(tmp_path, "default", "bf16-mixed", "mlm")
    run_case("default", "bf16-mixed", "mlm", out)
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["optimizer_states"][0]["param_groups"][0]["fused"] is True
