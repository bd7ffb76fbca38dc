"""Time to quality: validation MLM loss after the same wall-clock budget, ours vs transformers.

    python bench/time_to_loss.py                  # bert_mini, 180 s of training each
    python bench/time_to_loss.py --budget 600     # the issue's 10 minutes each

Both train `bert_mini` from the same initial weights on the same packed 128-token blocks of the
bundled C4 sample with the same tokenizer: ours with our MLMCollator and model, the baseline
`transformers.BertForPreTraining` (sdpa) with `DataCollatorForLanguageModeling` (its dense MLM
head; loss from its prediction logits). Same AdamW (`adamw`) and schedule (`warmup_linear_decay`,
here over the budget's time instead of steps, so both reach its end). Steps alternate
ours/theirs in one process, each charged only its own time (data collation included), until
each has spent the budget; both are then scored on the same held-out, once-masked blocks.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, replace

import torch
import torch.nn.functional as F
from steps import hf_collator, hf_model, model_config
from torch.utils.data import DataLoader

from bert_lightning.config import configured
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.model import BertForPreTraining
from bert_lightning.training.optim import warmup_linear_decay

SCHEDULE_STEPS = 1000  # the schedule's resolution over the budget


class Trainee:
    """One model on its own loader, charged the time of its own steps only."""

    def __init__(self, name, model, loss, loader, optim, budget: float, warmup: float):
        self.name, self.model, self.loss, self.loader = name, model.train(), loss, loader
        self.opt, self.lr = optim(model, 1)["optimizer"], optim.keywords["lr"]
        self.factor = warmup_linear_decay(int(warmup * SCHEDULE_STEPS), SCHEDULE_STEPS)
        self.budget, self.spent, self.steps = budget, 0.0, 0
        self.batches = iter(loader)

    def step(self) -> None:
        t = time.perf_counter()
        try:
            batch = next(self.batches)
        except StopIteration:  # a new epoch
            self.batches = iter(self.loader)
            batch = next(self.batches)
        for g in self.opt.param_groups:
            g["lr"] = self.lr * self.factor(int(SCHEDULE_STEPS * self.spent / self.budget))
        self.opt.zero_grad(set_to_none=True)
        self.loss(self.model, batch).backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.spent += time.perf_counter() - t
        self.steps += 1

    @property
    def done(self) -> bool:
        return self.spent >= self.budget


def ours_loss(model, batch: dict, reduction: str = "mean") -> torch.Tensor:
    """Our head runs on the picked positions only."""
    out = model(batch["input_ids"], labels=batch["labels"], mlm_positions=batch["mlm_positions"])
    return out.mlm_loss if reduction == "mean" else out.mlm_loss * (out.mlm_labels != -100).sum()


def hf_loss(model, batch: dict, reduction: str = "mean") -> torch.Tensor:
    """HF's head scores every position; the loss keeps the picked ones (labels != -100)."""
    logits = model(input_ids=batch["input_ids"]).prediction_logits  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), reduction=reduction)


@torch.no_grad()
def val_loss(t: Trainee, loader) -> float:
    t.model.eval()
    total = count = 0
    for batch in loader:
        total += float(t.loss(t.model, batch, reduction="sum"))
        count += int((batch["labels"] != -100).sum())
    t.model.train()
    return total / count


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--budget", type=float, default=180.0, help="seconds of training each")
    p.add_argument("--size", default="bert_mini")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=float, default=0.06, help="share of the budget")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    dm = configured("data", [f"seed={args.seed}"], out_dir=None)
    tok = dm.build_tokenizer()
    dm.setup("fit")
    c = replace(
        model_config(args.size, tok.get_vocab_size()), pad_token_id=special_ids(tok)["[PAD]"]
    )
    ours = BertForPreTraining(c)
    theirs = hf_model(ours)
    hf_loader = DataLoader(
        dm.train_set,
        batch_size=dm.batch_size,
        shuffle=True,
        collate_fn=hf_collator(tok, dm.masking.mlm_probability),
    )
    optim = configured("optim", [f"optim.lr={args.lr}"])  # AdamW; the rate is set per step
    trainees = [
        Trainee("ours", ours, ours_loss, dm.train_dataloader(), optim, args.budget, args.warmup),
        Trainee("transformers", theirs, hf_loss, hf_loader, optim, args.budget, args.warmup),
    ]
    val = dm.val_dataloader()
    start = {t.name: val_loss(t, val) for t in trainees}
    print(
        f"{args.size} ({c.num_hidden_layers}x{c.hidden_size}, vocab {c.vocab_size}), "
        f"{len(dm.train_set)} training blocks of {dm.max_seq_length}, batch {dm.batch_size}, "
        f"budget {args.budget:.0f} s each, steps alternating; config {asdict(c)}",
        flush=True,
    )
    while not all(t.done for t in trainees):
        for t in trainees:
            if not t.done:
                t.step()
    for t in trainees:
        print(
            f"{t.name:13s} {t.steps:5d} steps in {t.spent:6.1f} s ({t.steps / t.spent:.2f} "
            f"steps/s): validation MLM loss {start[t.name]:.3f} -> {val_loss(t, val):.3f}"
        )


if __name__ == "__main__":
    main()
