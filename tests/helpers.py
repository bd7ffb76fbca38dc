"""What the tests share: the repository's paths, tiny configs and corpora, and the running,
bounding and signalling of subprocesses. (conftest.py keeps pytest's fixtures and settings.)"""

import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bert_lightning.cli import main
from bert_lightning.config import bundled, compose, configured
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.masking import MaskingConfig
from bert_lightning.shipped import group_defaults

SAMPLE = bundled("c4_sample.jsonl")
ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bert_lightning"


def shipped(path: str) -> dict:
    """A config file of conf/ as it ships (`optim/adamw`), with the files its defaults name."""
    group, _, name = path.rpartition("/")
    return group_defaults(group, name)


OPTIM = shipped("optim/adamw")
# the tests' tiny encoder: debug=tiny's (conf/debug/tiny.yaml), as BertConfig fields; a test adds
# its vocabulary, positions, or a field of its own
TINY_BERT = shipped("debug/tiny")["model"]
TINY_MODEL = dict(TINY_BERT, vocab_size=97, max_position_embeddings=64)  # no tokenizer needed
TINY_NO_DROPOUT = dict(TINY_MODEL, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
# a run that checkpoints and validates every 4 of its 8 steps: what the resume tests stop
RESUMABLE = (
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "callbacks.model_checkpoint.every_n_train_steps=4",
)


def killed_and_resumed_bitwise(run) -> Path:
    """`run(name, *overrides)` -> its last.ckpt, three times: whole, killed before step 5
    (probe.CrashAt), resumed from the killed run's last.ckpt. The resumed run ends at step 8
    with the whole run's weights, bit for bit; returns its last.ckpt."""
    whole = run("whole")
    with pytest.raises(RuntimeError, match="simulated crash"):
        run("killed", "+callbacks.crash._target_=probe.CrashAt", "+callbacks.crash.step=4")
    killed = whole.parents[2] / "killed" / "checkpoints" / "last.ckpt"
    resumed = run("resumed", f"ckpt_path={killed}")
    a = torch.load(whole, weights_only=True)
    b = torch.load(resumed, weights_only=True)
    assert a["global_step"] == b["global_step"] == 8
    for name, tensor in a["state_dict"].items():
        assert torch.equal(tensor, b["state_dict"][name]), name
    return resumed


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


def data_module(option: str = "c4_sample", **values):
    """The pretraining DataModule of `data=OPTION` as it ships, `values` merged over its config
    (a dict value, such as `masking`, key by key); by default no run folder and a tokenizer
    trained from its config when set up (`given_tokenizer=` gives one, as a run's start does:
    `build_tokenizer`)."""
    given = values.pop("given_tokenizer", None)
    dm = configured("data", [f"data={option}"], **{"out_dir": None} | values)
    if given is not None:
        dm.build_tokenizer(given)
    return dm


def masking(**values) -> MaskingConfig:
    """The shipped `data.masking`, `values` over it."""
    return MaskingConfig(**shipped("data/_corpus")["masking"] | values)


def write_corpus(path: Path, n_docs: int = 60, chars: int | None = None) -> Path:
    """The first `n_docs` documents of the bundled C4 sample (each cut to its first `chars`
    characters when given), as a standalone file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, text in enumerate(iter_documents([SAMPLE])):
            if i == n_docs:
                break
            f.write(json.dumps({"text": text[:chars], "url": f"u{i}"}) + "\n")
    return path


def pretrain_tiny(out_dir: Path, *extra: str) -> float | None:
    """A debug=tiny train.py run, in process, on 60 documents it writes into `out_dir`."""
    from bert_lightning.training.pretrain import train

    write_corpus(out_dir / "corpus.jsonl")
    return train(compose(overrides=tiny_overrides(out_dir, *extra)))


def c4_shard(path: Path, docs) -> str:
    """A file shaped like a C4 shard: gzipped JSON lines with text, timestamp and url."""
    lines = [
        json.dumps({"text": t, "timestamp": "2019", "url": f"u{i}"}) for i, t in enumerate(docs)
    ]
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    return str(path)


def subprocess_env(*also: Path) -> dict:
    """The environment of a test's subprocess run: the tests' and the project's modules
    importable (and `also`'s, e.g. bench/), one thread a process, nothing fetched from a hub,
    the stacks written on SIGABRT (`bounded_output`)."""
    path = [str(ROOT / "tests"), str(ROOT), *map(str, also)]
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    e.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_SILENT="true", PYTHONFAULTHANDLER="1")
    return e


def run_in_session(
    cmd: list[str], env: dict, bound: float, cwd: str | Path | None = None
) -> subprocess.CompletedProcess:
    """`cmd` in a session (process group) of its own, as a process manager starts a job:
    returns once it has exited and every process of its group is gone; fails the test when
    one is still there `bound` seconds after the start (with every process's Python stacks,
    `bounded_output`), or 10 s after the output closed."""
    p = subprocess.Popen(
        cmd,
        env=env | {"PYTHONFAULTHANDLER": "1"},  # `bounded_output`'s stacks
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    stdout, stderr = bounded_output(p, bound)
    assert session_ends(p.pid), f"a process of the run outlived its output: {stderr[-2000:]}"
    return subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)


def run_script(script: str, args: list[str], cwd: Path) -> None:
    """`python SCRIPT ARGS` in `cwd`, tests/ importable (a test's callbacks); must succeed."""
    env = subprocess_env()
    cmd = [sys.executable, str(ROOT / script), *args]
    proc = run_in_session(cmd, env, 600, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]


def bounded_output(p: subprocess.Popen, bound: float) -> tuple[str, str]:
    """(stdout, stderr) of `p`, started in a session of its own with PYTHONFAULTHANDLER=1, once it
    exits. If it has not within `bound` s, the test fails with the Python stacks of every
    process of its group (SIGABRT: faulthandler writes each thread's stack to stderr), so that
    a hang shows where it hangs and a slow run what it was doing."""
    try:
        return p.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        for pid in group_members(p.pid):  # one at a time: their stacks do not interleave
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGABRT)
            time.sleep(0.5)
        try:
            _, stderr = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:  # stuck in C code: nothing more to read
            signal_group(p.pid, signal.SIGKILL)
            _, stderr = p.communicate()
        signal_group(p.pid, signal.SIGKILL)  # the group's other processes
        first = stderr.find("Fatal Python error")
        stacks = stderr[first:] if first >= 0 else stderr[-4000:]
        pytest.fail(
            f"{' '.join(map(str, p.args))[:300]}: still running after {bound} s; the Python "
            f"stacks of its processes:\n{stacks[-30000:]}",
            pytrace=False,
        )


def group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid`, from /proc."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.getpgid(int(entry)) == pgid:
                    members.append(int(entry))
    return sorted(members)


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


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


def cli_error(capsys, *argv) -> str:
    """The one stderr line of `bert-lightning ARGV` (in process) failing on a user's mistake."""
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and err.rstrip().endswith(lines[0])
    return lines[0]
