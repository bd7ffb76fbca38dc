"""Claim 5 of the brackets suite over pretraining seeds: which classifier finds the wrong closer.

    python bench/brackets_seeds.py outputs/brackets_seeds 1 2 3 4 5

For each seed: `train.py experiment=brackets seed=N` and the four fine-tuning runs of the report
(`finetune.py experiment=brackets_grammar`, max-pooled, and the same from `[CLS]`), all through
`run_all`; plus a linear probe that asks whether the first layer's output at a closer already says
"this closer is wrong". A `[CLS]` classifier reads the last layer's `[CLS]` row, which attends
to first-layer rows only, so it can find the wrong closer quickly only where that probe is high.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from bert_lightning.data.brackets import brackets_tokenizer, grammar_rows
from bert_lightning.experiments.brackets import load_pretrained, run_all

QUIET = ["trainer.enable_progress_bar=false", "trainer.enable_model_summary=false"]


def closer_rows(n: int, seed: int, tok) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 17) ids of grammar-task sentences and (n, 8) bool: which closers are wrong."""
    rows = grammar_rows(n, 8, torch.Generator().manual_seed(seed))
    cls = tok.token_to_id("[CLS]")
    ids = torch.tensor([[cls] + [tok.token_to_id(s) for s in r["sentence"].split()] for r in rows])
    shift = tok.token_to_id("A") - tok.token_to_id("a")
    return ids, ids[:, 2::2] - shift != ids[:, 1::2]  # (n, 8)


def layer1_probe(model, steps: int = 500) -> float:
    """Balanced accuracy (percent) of a logistic regression on first-layer closer rows -> wrong."""
    tok = brackets_tokenizer()
    model.eval()
    feats = []
    for seed in (0, 1):  # train, test
        ids, wrong = closer_rows(4000, seed, tok)
        with torch.no_grad():
            h = model.bert(ids, output_hidden_states=True).hidden_states[1][:, 2::2]  # (n, 8, H)
        feats.append((h.reshape(-1, h.size(-1)), wrong.reshape(-1).float()))
    (x, y), (xt, yt) = feats
    mu, sd = x.mean(0), x.std(0) + 1e-6
    clf = nn.Linear(x.size(1), 1)
    opt = torch.optim.Adam(clf.parameters(), lr=1e-2)
    weight = torch.where(y == 1, 1 - y.mean(), y.mean())  # both classes weigh the same
    for _ in range(steps):
        logits = clf((x - mu) / sd).squeeze(-1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y, weight=weight)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = clf((xt - mu) / sd).squeeze(-1) > 0
    return 50 * (pred[yt == 1].float().mean() + (~pred[yt == 0]).float().mean()).item()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("seeds", nargs="+", type=int)
    args = p.parse_args()
    lines = []
    for seed in args.seeds:
        out = args.out_dir / f"seed{seed}"
        r = run_all(out, [f"seed={seed}", *QUIET], ["bidirectional"])
        probe = layer1_probe(load_pretrained(out / "bidirectional" / "checkpoints" / "last.ckpt"))
        ft = " | ".join(f"{v:5.1f}" for v in r["finetune"].values())
        lines.append(f"| {seed} | {r['bidirectional']['overall']:5.1f} | {probe:5.1f} | {ft} |")
    names = " | ".join(r["finetune"])
    print(f"\n| seed | MLM acc | layer-1 probe | {names} |")
    print("|---" * (3 + len(r["finetune"])) + "|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
