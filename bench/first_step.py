"""How long a pretraining run takes to reach its first step, what its validations cost and its
whole wall time: `train.py OVERRIDES` as a subprocess, each line of its output stamped as it
arrives (the first `step 1/...` line marks the first step; each `validation at step ...` line
ends with the seconds it took). Run it twice on a corpus: the second run shows what the caches
save.

    python bench/first_step.py --json first.json experiment=cpu_30min data=corpus \\
        'data.train_files=[...]' 'data.val_files=[...]' trainer.max_time=00:00:08:00
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VALIDATION = re.compile(r"^validation at step (\d+): .* \((\d+\.\d) s\)$")


def timeline(lines) -> dict:
    """(seconds since start, line) pairs -> the figures."""
    first = next((t for t, line in lines if line.startswith("step ")), None)
    vals = [(t, VALIDATION.match(line)) for t, line in lines]
    vals = [(t, int(m[1]), float(m[2])) for t, m in vals if m]
    return {
        "first_step_s": first,
        "wall_s": lines[-1][0] if lines else None,
        "validations": len(vals),
        "validation_s": sum(v[2] for v in vals),
        "validation_steps": [v[1] for v in vals],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("overrides", nargs="+", help="train.py overrides")
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    start = time.monotonic()
    cmd = [sys.executable, str(ROOT / "train.py"), *args.overrides]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        print(f"{lines[-1][0]:7.1f} s  {lines[-1][1]}", flush=True)
    rc = proc.wait()
    lines.append((time.monotonic() - start, ""))
    out = timeline(lines) | {"exit": rc, "overrides": args.overrides}
    share = out["validation_s"] / out["wall_s"] if out["wall_s"] else 0.0
    first = f"after {out['first_step_s']:.0f} s" if out["first_step_s"] is not None else "never"
    print(
        f"first step {first}; {out['validations']} validations, {out['validation_s']:.0f} s "
        f"({share:.1%} of the wall time); wall {out['wall_s']:.0f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    sys.exit(rc)


if __name__ == "__main__":
    main()
