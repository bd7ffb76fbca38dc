"""One pretraining step, ours vs `transformers.BertForPreTraining`, timed side by side.

    python bench/train_step.py                       # bert_mini, bert_small, bert_base on the CPU
    python bench/train_step.py --sizes bert_base --device cuda --compile   # on a GPU

Same config (vocab 30,522), same weights, same batch (packed, 15% picked, NSP labels), same AdamW
(`bert_lightning.training.optim.adamw`). Steps alternate ours/theirs after warm-up; each
figure is a median over steps. Our achieved FLOP/s counts only the work we do
(`pretraining_flops`) and is set against a matmul peak measured between the steps (same
noise), or, on a GPU, the device table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from steps import hf_model, make_step, model_config, random_batch, timed, without_positions

from bert_lightning.config import configured
from bert_lightning.model import BertForPreTraining, pretraining_flops
from bert_lightning.model.flops import step_counts
from bert_lightning.training.callbacks import device_peak_flops

STEPS = {"bert_mini": 12, "bert_small": 8, "bert_base": 4}  # timed steps per model, CPU


def matmul_probe(device, dtype):
    """One (n x n) @ (n x n) product: returns its FLOP/s (the peak is the median of these)."""
    n = 8192 if device.type == "cuda" else 2048
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)

    def probe() -> float:
        return 2 * n**3 / timed(lambda: a @ b, device)

    probe()
    return probe


def build(size: str, device, compile_: bool, seed: int = 0):
    torch.manual_seed(seed)
    c = model_config(size)
    ours = BertForPreTraining(c).to(device).train()
    theirs = hf_model(ours).to(device).train()
    optim = configured("optim", ["optim.lr=1e-4"])
    opt_ours = optim(ours, 1)["optimizer"]
    opt_theirs = optim(theirs, 1)["optimizer"]
    run = torch.compile(ours) if compile_ else ours
    return c, ours, theirs, run, opt_ours, opt_theirs


def bench_size(size: str, args, device) -> dict:
    B, T = args.batch_size, args.seq_len
    c, ours, theirs, run, opt_ours, opt_theirs = build(size, device, args.compile)
    batch = random_batch(c, B, T, device)
    flops = int(pretraining_flops(c, **step_counts(batch)))
    bf16 = torch.bfloat16
    on_gpu = device.type == "cuda"
    # on a GPU both run in bf16 autocast (what one trains with there); on the CPU fp32 first
    main_dtype = bf16 if on_gpu else None
    steps = {
        "ours": make_step(run, opt_ours, batch, main_dtype),
        "theirs": make_step(theirs, opt_theirs, without_positions(batch), main_dtype),
    }
    if not on_gpu and not args.no_bf16:
        steps["ours_bf16"] = make_step(run, opt_ours, batch, bf16)
    # only the peaks a figure divides by (a CPU without bf16 units takes a minute per product)
    peak_dtype = "bf16" if on_gpu else "fp32"
    dtypes = {peak_dtype} | ({"bf16"} if "ours_bf16" in steps else set())
    probes = {k: matmul_probe(device, {"fp32": torch.float32, "bf16": bf16}[k]) for k in dtypes}
    for fn in steps.values():  # warm-up (and compile)
        for _ in range(args.warmup):
            fn()
    times = {k: [] for k in steps} | {k: [] for k in probes}
    n = args.steps or (STEPS[size] * (10 if on_gpu else 1))
    for _ in range(n):
        for k, fn in steps.items():
            times[k].append(timed(fn, device))
        for k, probe in probes.items():
            times[k].append(probe())
    med = {k: statistics.median(v) for k, v in times.items()}
    tok = B * T
    table_peak = device_peak_flops(device, "bf16-mixed") if on_gpu else None
    r = {
        "size": size,
        "steps": n,
        "ours_s": med["ours"],
        "theirs_s": med["theirs"],
        "ours_tok_s": tok / med["ours"],
        "theirs_tok_s": tok / med["theirs"],
        "ratio": med["theirs"] / med["ours"],
        "gflops": flops / med["ours"] / 1e9,
        "peak_gflops": med[peak_dtype] / 1e9,
        "table_peak_gflops": table_peak / 1e9 if table_peak else None,
    }
    if "ours_bf16" in med:
        r["bf16_speedup"] = med["ours"] / med["ours_bf16"]
        r["bf16_gflops"] = flops / med["ours_bf16"] / 1e9
        r["bf16_peak_gflops"] = med["bf16"] / 1e9
    if args.profile:
        profile(size, steps, device)
    return r


def profile(size: str, steps: dict, device, row_limit: int = 15) -> None:
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name, fn in steps.items():
        with profile(activities=acts) as prof:
            for _ in range(2):
                fn()
        print(f"\n## profile {size} {name} (2 steps), top ops by self time")
        print(prof.key_averages().table(sort_by=key, row_limit=row_limit))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["bert_mini", "bert_small", "bert_base"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=None, help="timed steps of each (default per size)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--compile", action="store_true", help="torch.compile our model")
    p.add_argument("--no-bf16", action="store_true", help="skip our CPU bf16-mixed step")
    p.add_argument("--profile", action="store_true", help="print torch.profiler top-ops tables")
    p.add_argument("--json", help="also write the rows to this JSON file (bench/gpu_check.sh)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"device {device} ({name}, {torch.get_num_threads()} threads), torch {torch.__version__}, "
        f"batch {args.batch_size} x seq {args.seq_len}, compile={args.compile}"
    )
    rows = []
    for size in args.sizes:
        r = bench_size(size, args, device)
        rows.append(r)
        line = (
            f"{size:10s} steps {r['steps']:3d} | s/step ours {r['ours_s']:.3f} theirs "
            f"{r['theirs_s']:.3f} | tokens/s ours {r['ours_tok_s']:8.0f} theirs "
            f"{r['theirs_tok_s']:8.0f} | ratio {r['ratio']:.2f}x | ours {r['gflops']:.0f} GFLOP/s"
            f" = {r['gflops'] / r['peak_gflops']:.0%} of measured matmul peak "
            f"{r['peak_gflops']:.0f}"
        )
        if r["table_peak_gflops"]:
            line += f" | MFU {r['gflops'] / r['table_peak_gflops']:.1%} of table bf16 peak"
        if "bf16_speedup" in r:
            line += (
                f" | bf16-mixed {r['bf16_speedup']:.2f}x our fp32 ({r['bf16_gflops']:.0f} GFLOP/s"
                f" = {r['bf16_gflops'] / r['bf16_peak_gflops']:.0%} of bf16 peak "
                f"{r['bf16_peak_gflops']:.0f})"
            )
        print(line, flush=True)
        if args.json:
            meta = dict(device=name, compile=args.compile, batch=args.batch_size, seq=args.seq_len)
            Path(args.json).write_text(json.dumps([{**meta, **r} for r in rows], indent=1))


if __name__ == "__main__":
    main()
