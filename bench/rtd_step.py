"""What replaced-token detection costs per step: an MLM step and an RTD step of the same
encoder, timed side by side on the same batch (steps alternate after warm-up; medians).

    python bench/rtd_step.py                                  # bert_mini, vocab 8,192, bf16
    python bench/rtd_step.py --size bert_small --generator-hidden-size 0.5 --no-bf16

The batch is packed text as `experiment=cpu_30min` trains it (32 x 128, 30% picked, all
`[MASK]`); the optimizer is AdamW. Prints one JSON line: milliseconds per step of each, their
ratio, and the share of the RTD step spent drawing the generator's samples.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch
from steps import model_config

from bert_lightning.data.masking import picked_positions
from bert_lightning.model import BertForPreTraining, ElectraForPreTraining
from bert_lightning.model.electra import sample_tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="bert_mini")
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--mlm-probability", type=float, default=0.3)
    p.add_argument("--generator-hidden-size", type=float, default=0.25)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-bf16", action="store_true")
    a = p.parse_args()
    c = model_config(a.size, a.vocab_size)
    c.hidden_dropout_prob = c.attention_probs_dropout_prob = 0.0
    g = torch.Generator().manual_seed(0)
    B, T = a.batch_size, a.seq_len
    ids = torch.randint(5, c.vocab_size, (B, T), generator=g)  # (B, T)
    picked = torch.rand(B, T, generator=g) < a.mlm_probability  # (B, T)
    picked[:, 0] = False
    labels, masked = torch.where(picked, ids, -100), torch.where(picked, 4, ids)
    positions = picked_positions(labels, int(picked.sum(1).max()))  # (B, K) as the collator's
    models = {
        "mlm": BertForPreTraining(c),
        "rtd": ElectraForPreTraining(c, a.generator_hidden_size, 50.0),
    }
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    amp = nullcontext() if a.no_bf16 else torch.autocast("cpu", dtype=torch.bfloat16)

    def step(name: str) -> float:
        t = time.perf_counter()
        with amp:
            out = models[name](masked, labels=labels, mlm_positions=positions)
        out.loss.backward()
        opts[name].step()
        opts[name].zero_grad()
        return time.perf_counter() - t

    times = {k: [] for k in models}
    draws = []
    P, V = int(picked.sum()), c.vocab_size
    logits = torch.randn(P, V)
    for i in range(a.warmup + a.steps):
        for name in models:
            dt = step(name)
            if i >= a.warmup:
                times[name].append(dt)
        t = time.perf_counter()
        sample_tokens(logits.softmax(-1))
        draws.append(time.perf_counter() - t)
    ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
    draw = 1000 * statistics.median(draws[a.warmup :])
    print(
        json.dumps(
            {
                "size": a.size,
                "batch": [B, T],
                "bf16": not a.no_bf16,
                "mlm_ms": round(ms["mlm"], 1),
                "rtd_ms": round(ms["rtd"], 1),
                "rtd_over_mlm": round(ms["rtd"] / ms["mlm"], 3),
                "sampling_share_of_rtd": round(draw / ms["rtd"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
