import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from bert_lightning.config import bundled
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.tokenizer import train_wordpiece

SAMPLE = bundled("c4_sample.jsonl")
OPTIM = {
    "_target_": "bert_lightning.training.optim.adamw",
    "_partial_": True,
    "lr": 1e-3,
}  # conf/optim
# the tests' tiny encoder (debug=tiny's, conf/debug/tiny.yaml), as BertConfig fields: a test adds
# its vocabulary, positions, or a field of its own
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def tiny_overrides(out_dir: Path, *extra: str) -> list[str]:
    """A train.py run small enough for a unit test (conf/debug/tiny.yaml: width 32, 2 layers,
    seq 32, vocab 600, 6 steps) on `out_dir/corpus.jsonl`, writing into `out_dir`."""
    return [
        "debug=tiny",
        f"paths.output_dir={out_dir}",
        f"data.cache_dir={out_dir / 'hf_cache'}",
        f"data.train_files={out_dir / 'corpus.jsonl'}",
        *extra,
    ]


def write_corpus(path: Path, n_docs: int = 60) -> Path:
    """The first `n_docs` documents of the bundled C4 sample, as a standalone file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, text in enumerate(iter_documents([SAMPLE])):
            if i == n_docs:
                break
            f.write(json.dumps({"text": text, "url": f"u{i}"}) + "\n")
    return path


def run_in_session(cmd: list[str], env: dict, bound: float) -> subprocess.CompletedProcess:
    """`cmd` in a session (process group) of its own, as a process manager starts a job:
    returns once it has exited and every process of its group is gone; fails the test when
    one is still there `bound` seconds after the start, or 10 s after the output closed."""
    p = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = p.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, stderr = p.communicate()
        pytest.fail(f"a process of the run was still there after {bound} s: {stderr[-2000:]}")
    assert session_ends(p.pid), f"a process of the run outlived its output: {stderr[-2000:]}"
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)


def session_ends(sid: int, seconds: float = 10.0) -> bool:
    """Whether every process of the session is gone within `seconds` (one that closed its
    output may take a moment to exit, and a zombie to be reaped)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(sid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="session")
def tiny_tokenizer():
    docs = list(iter_documents([SAMPLE]))[:200]
    return train_wordpiece(lambda: iter(docs), vocab_size=800)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# tiny models gain nothing from intra-op threads, and lose a lot on a busy machine
torch.set_num_threads(1)


os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("WANDB_SILENT", "true")
