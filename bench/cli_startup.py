"""How soon `bert-lightning` answers: the seconds `bert-lightning --help` and each
`bert-lightning COMMAND --help` take to exit, and the seconds to the first output line (stdout
or stderr) of `score`, `embed` and `evaluate` on a 10-row file with a tiny model (a fine-tuned
checkpoint and a Hugging Face folder, made with the tests' own helpers). Medians of `--runs`
runs, each a fresh process. `--before ROOT` times the same runs of another checkout's package
(its `bert_lightning` on PYTHONPATH) beside this one's, in one session.

    python bench/cli_startup.py [--runs 5] [--before /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def first_line_s(argv: list[str], env: dict, cwd: Path, first: bool) -> float:
    """Seconds until the process prints its first line (`first`) or exits; a failure raises."""
    start = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    line = p.stdout.readline()
    at = time.perf_counter() - start
    out = line + p.stdout.read()
    if p.wait() != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}\n{out.decode()[-2000:]}")
    return at if first else time.perf_counter() - start


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--before", type=Path, help="another checkout: its package timed beside")
    a = p.parse_args()
    from bert_lightning.cli import COMMANDS

    trees = {"after": ROOT} | ({"before": a.before} if a.before else {})
    with tempfile.TemporaryDirectory() as tmp:
        uses = inputs(Path(tmp))
        runs = [("--help", ["--help"], False)]
        runs += [(f"{c} --help", [c.replace("_", "-"), "--help"], False) for c in COMMANDS]
        runs += [(f"{name}, first line", argv, True) for name, argv in uses.items()]
        print(f"medians of {a.runs} runs, seconds; load average {os.getloadavg()[0]:.2f}")
        print(f"| bert-lightning ... | {' | '.join(trees)} |")
        print(f"|---|{'---:|' * len(trees)}")
        for what, argv, first in runs:
            medians = []
            for tree in trees.values():
                env = os.environ | {"PYTHONPATH": str(tree)}
                cmd = [sys.executable, "-m", "bert_lightning", *argv]
                times = [first_line_s(cmd, env, Path(tmp), first) for _ in range(a.runs)]
                medians.append(f"{statistics.median(times):.2f}")
            print(f"| {what} | {' | '.join(medians)} |", flush=True)
        print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
