"""Multi-process runs of train.py on the CPU (gloo): DDP with 2 processes, two torchrun
"nodes" on localhost, and FSDP2 with 2 processes, each against a 1-process run with the same
global batch.

Making the runs comparable: dropout 0; every real token a prediction target and left in
place (mlm_probability=1, p_mask=p_random=0), so masking draws nothing that differs between
process layouts and every packed example has the same number of targets (then the mean of
the two ranks' mean losses, which DDP's gradient averaging implies, is the 1-process mean);
the 1-process reference also runs strategy=ddp so that it reads the data through the same
DistributedSampler permutation (seed 1234): its step-k batch is the union of the two ranks'.
"""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import ROOT, bounded_output, subprocess_env, tiny_overrides, write_corpus
from probe import read_probes

STEPS = 3
DDP = "trainer.strategy=ddp"  # as trainer=ddp has it
COMPARABLE = [
    "model.hidden_dropout_prob=0",
    "model.attention_probs_dropout_prob=0",
    "data.masking.mlm_probability=1.0",
    "data.masking.p_mask=0",
    "data.masking.p_random=0",
    "optim.lr=1e-2",
    "optim.warmup_steps=0",  # full lr from step 0: the loss falls clearly step by step
    f"trainer.max_steps={STEPS}",
    f"trainer.val_check_interval={STEPS}",
    "validate_before_fit=false",
    "+callbacks.probe._target_=probe.LossProbe",
]


def train_cmd(out: Path, *extra: str, cache: str | None = None) -> list[str]:
    overrides = tiny_overrides(out, *COMPARABLE, *extra)
    if cache:
        overrides = [o for o in overrides if not o.startswith("data.cache_dir=")]
        overrides.append(f"data.cache_dir={cache}")
    return [str(ROOT / "train.py"), *overrides, f"hydra.run.dir={out}"]  # not ./outputs


def run_train(out: Path, *extra: str) -> list[dict]:
    write_corpus(out / "corpus.jsonl")
    r = subprocess.run(
        [sys.executable, *train_cmd(out, *extra)],
        env=subprocess_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return read_probes(out)


def global_losses(probes: list[dict], name: str, reference: list[float] | None = None):
    """Per step, the mean over ranks (ranks hold equal numbers of targets, see above); printed
    with its largest distance to `reference` (docs/multinode.md's table, `pytest -s`)."""
    losses = [sum(p["losses"][s] for p in probes) / len(probes) for s in range(STEPS)]
    diff = max(abs(a - b) for a, b in zip(losses, reference or losses, strict=True))
    print(f"{name:24s}", *(f"{x:.6f}" for x in losses), f"max abs diff {diff:.1e}")
    return losses, diff


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One process, batch 8."""
    out = tmp_path_factory.mktemp("one") / "run"
    probes = run_train(out, DDP, "trainer.devices=1", "data.batch_size=8")
    assert len(probes) == 1
    losses, _ = global_losses(probes, "1 process, batch 8")
    assert losses[2] < losses[0] - 0.1, losses  # training moves the loss: matching means something
    return losses


@pytest.mark.slow
def test_ddp_two_processes_match_one(tmp_path, reference):
    probes = run_train(tmp_path / "run", "trainer=ddp_sim", "data.batch_size=4")
    assert len(probes) == 2
    assert probes[0]["losses"][0] != probes[1]["losses"][0]  # the ranks saw different data
    losses, diff = global_losses(probes, "DDP, 2 processes x 4", reference)
    assert diff <= 1e-4, (losses, reference)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_fsdp_two_processes_shard_each_layer_and_match_one(tmp_path, reference):
    from bert_lightning.checkpoint import read_checkpoint

    out = tmp_path / "run"
    probes = run_train(
        out,
        "trainer=fsdp",
        "trainer.accelerator=cpu",
        "trainer.devices=2",
        "trainer.precision=32-true",
        "data.batch_size=4",
    )
    assert len(probes) == 2
    for p in probes:  # each encoder layer is its own FSDP unit, the model the root one
        assert p["sharded"] == ["model", "model.bert.encoder.layer.0", "model.bert.encoder.layer.1"]
    _, diff = global_losses(probes, "FSDP2, 2 processes x 4", reference)
    assert diff <= 1e-4
    # the checkpoint is one file holding full (unsharded) tensors: portable
    ckpt = read_checkpoint(out / "checkpoints" / "last.ckpt")
    w = ckpt.state_dict["bert.encoder.layer.0.intermediate.dense.weight"]
    assert type(w) is torch.Tensor and w.shape == (64, 32)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_torchrun_two_nodes_on_localhost(tmp_path, reference):
    """Two torchrun agents, one process each, meet over c10d rendezvous: world size 2 across
    "nodes", Lightning reading the torchelastic environment."""
    out = tmp_path / "run"
    write_corpus(out / "corpus.jsonl")
    port = free_port()
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=bert-lightning-test",
    ]
    extra = ["trainer.accelerator=cpu", DDP, "trainer.num_nodes=2"]
    extra.append("data.batch_size=4")
    nodes = [  # each node prepares its own data cache, as nodes without a shared disk would
        subprocess.Popen(
            torchrun + train_cmd(out, *extra, cache=str(tmp_path / f"cache{n}")),
            env=subprocess_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for n in range(2)
    ]
    errors = [bounded_output(p, 300)[1] for p in nodes]
    for p, err in zip(nodes, errors, strict=True):
        assert p.returncode == 0, err[-3000:]
    probes = read_probes(out)
    assert len(probes) == 2
    _, diff = global_losses(probes, "torchrun, 2 nodes x 1", reference)
    assert diff <= 1e-4
