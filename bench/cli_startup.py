"""How soon the command line answers: the seconds each `--help` takes to exit
(`bert-lightning --help`, every `bert-lightning COMMAND --help`, `python train.py --help`,
`python finetune.py --help`) and the seconds to the first output line (stdout or stderr) of
`score`, `embed` and `evaluate` on a 10-row file with a tiny model (made as the tests make
theirs, `inputs`). Each a fresh process; the runs go round the cases `--runs`
times, so that a change in the machine's load falls on all of them alike, and a case's figure
is the median of its runs. `--before ROOT` times another checkout's package beside this one's
(its `bert_lightning` on PYTHONPATH, its train.py), in the same rounds. A table on stdout,
every run's seconds and each first line in `--out` (JSON).

    python bench/cli_startup.py [--runs 5] [--before /path/to/old/checkout] [--out cli.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

SCRIPTS = ("train.py", "finetune.py")


def timed(argv: list[str], env: dict, cwd: Path, first: bool) -> tuple[float, str]:
    """Seconds until the process prints its first line (`first`) or exits, and that line; a
    failure raises. A line ends at a carriage return too: a tqdm bar's first state (`score:
    0%`) is one, redrawn in place, whose newline comes when the bar closes, the work done."""
    start = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    line = b""
    while (c := p.stdout.read(1)) and (c not in b"\r\n" or not line.strip()):
        line += c
    at = time.perf_counter() - start
    out = line + c + p.stdout.read()
    if p.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}\n{out.decode()[-2000:]}")
    return (at if first else time.perf_counter() - start), line.decode().strip()


def inputs(folder: Path) -> dict[str, list[str]]:
    """Each use's arguments after `bert-lightning`: its model and 10-row file, made here."""
    from finetune_fixtures import (
        ad_rows,
        relevance_ckpt,
        write_csv,
        write_hf_folder,
        write_tokenizer,
    )

    tok = write_tokenizer(folder / "tokenizer.json")
    ckpt, _ = relevance_ckpt(folder, tok)
    write_hf_folder(folder / "hf", tok)
    relevant = [r | {"label": int(r["label"] == 3)} for r in ad_rows(4)[:10]]  # binary task
    rows = write_csv(folder / "rows.csv", relevant)
    texts = folder / "texts.txt"
    texts.write_text("".join(f"the movie was {w}\n" for w in ("good", "bad") * 5))
    return {
        "score": ["score", str(ckpt), str(rows), str(folder / "scored.csv")],
        "embed": ["embed", str(folder / "hf"), str(texts), str(folder / "vectors.npy")],
        "evaluate": ["evaluate", str(ckpt), str(rows)],
    }


def cases(uses: dict[str, list[str]]) -> list[tuple[str, list[str], bool]]:
    """(name, the command after the interpreter with `{tree}` for the checkout, first line?)."""
    from bert_lightning.cli import COMMANDS

    cli = ["-m", "bert_lightning"]
    out = [("bert-lightning --help", [*cli, "--help"], False)]
    for c in COMMANDS:
        name = c.replace("_", "-")
        out.append((f"bert-lightning {name} --help", [*cli, name, "--help"], False))
    out += [(f"python {s} --help", [f"{{tree}}/{s}", "--help"], False) for s in SCRIPTS]
    out += [(f"bert-lightning {name}, first line", [*cli, *a], True) for name, a in uses.items()]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--before", type=Path, help="another checkout: its package timed beside")
    p.add_argument("--out", type=Path, help="where to write the results (JSON)")
    a = p.parse_args()
    trees = {"after": ROOT} | ({"before": a.before.resolve()} if a.before else {})
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        todo = cases(inputs(Path(tmp)))
        runs = {(what, tree): [] for what, _, _ in todo for tree in trees}
        lines = {}
        for _ in range(a.runs):
            for what, argv, first in todo:
                for tree, root in trees.items():
                    env = os.environ | {"PYTHONPATH": str(root)}
                    cmd = [sys.executable, *(x.format(tree=root) for x in argv)]
                    seconds, line = timed(cmd, env, Path(tmp), first)
                    lines[what, tree] = line.replace(f"{tmp}/", "")  # no machine's paths
                    runs[what, tree].append(seconds)
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print(
        f"medians of {a.runs} runs, seconds; load average {load:.2f}, then {os.getloadavg()[0]:.2f}"
    )
    print(f"| command | {' | '.join(trees)} |\n|---|{'---:|' * len(trees)}")
    for what, _, _ in todo:
        print(f"| {what} | {' | '.join(f'{medians[what, t]:.2f}' for t in trees)} |")
    if a.out:
        results = [
            {"command": w, "tree": t, "median_s": medians[w, t], "runs_s": runs[w, t]}
            | ({"first_line": lines[w, t]} if first else {})
            for w, _, first in todo
            for t in trees
        ]
        machine = {
            "cores": len(os.sched_getaffinity(0)),
            "load_average": [load, os.getloadavg()[0]],
        }
        record = {"runs": a.runs, "trees": list(trees)} | machine  # after: this checkout
        a.out.write_text(json.dumps(record | {"results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
