"""Padded batches, timed side by side: our encoder on the real tokens alone (the default), the
same model computing every pad position (its forward's `unpad=False`), and `transformers`
(sdpa) on the same weights and batches.

    python bench/padded_step.py                          # every workload, fp32 and bf16, CPU
    python bench/padded_step.py --workloads home_depot_cross --steps 20 --device cuda

Workloads, each padded to its longest row per batch as the data modules pad them:
- `home_depot_cross` / `home_depot_bi`: all-MiniLM-L6-v2's shape, batch 32, `[CLS] query [SEP]
  title [SEP]` pairs cut at 48, the query and title lengths drawn from their distributions in
  Home Depot (MiniLM's word pieces over 8,000 training rows: 41% of the cross-encoder's
  positions are padding); the cross-encoder (one logit, BCE) and the bi-encoder (query and title
  encoded apart, cosine).
- `sst2`: the same shape, batch 32, SST-2 sentence lengths cut at 64 (67% padding).
- `nsp`: bert_mini pretraining (MLM + NSP, sparse MLM head) on `data=c4_nsp` batches of the
  bundled sample, as `train.py data=c4_nsp` makes them.
- `packed`: bert_mini on packed 128-token blocks (no padding): the control, both paths the same.
- `packed_isolated`: bert_mini on `data.packing=packed_isolated` blocks of the bundled sample
  (no padding; attention within each document through a (B, 1, T, T) mask). Its "padded"
  column is our model on the same blocks attending across documents (plain packing), so
  `vs padded` is what isolation costs; `transformers` attends across documents too.
Steps alternate the three after warm-up, each first in turn; each figure is a median over
steps. Dropout as in training (0.1).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from steps import (
    QUERY,
    SST2,
    TITLE,
    draw,
    hf_model,
    make_step,
    model_config,
    random_batch,
    timed,
    without_positions,
)

from bert_lightning.config import configured
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.interop import ours_to_hf
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.model.heads import BertBiEncoder, BertForSequenceClassification

MINILM = BertConfig(
    vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
    intermediate_size=1536,
)  # fmt: skip


def padded(first: torch.Tensor, second: torch.Tensor | None, c: BertConfig, g) -> dict:
    """[CLS] a [SEP] (b [SEP]) rows of the given lengths (with their specials), padded to the
    longest; the second segment's token type 1."""
    total = first if second is None else first + second - 1  # (B,)
    T = int(total.max())
    pos = torch.arange(T)  # (T,)
    mask = (pos < total[:, None]).long()  # (B, T)
    ids = torch.randint(5, c.vocab_size, (len(first), T), generator=g) * mask  # (B, T)
    types = ((pos >= first[:, None]) & mask.bool()).long()  # (B, T)
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}


def pair_batches(n: int, batch: int, max_len: int, c: BertConfig, g) -> list[dict]:
    out = []
    for _ in range(n):
        q = draw(QUERY, batch, g)
        t = (draw(TITLE, batch, g)).clamp(max=max_len + 1 - q)  # the pair fits max_len
        b = padded(q, t, c, g)
        b["labels"] = torch.rand(batch, generator=g)  # graded relevance in [0, 1]
        out.append(b)
    return out


def sentence_batches(n: int, batch: int, c: BertConfig, g) -> list[dict]:
    out = []
    for _ in range(n):
        b = padded(draw(SST2, batch, g), None, c, g)
        b["labels"] = torch.randint(0, 2, (batch,), generator=g)
        out.append(b)
    return out


def corpus_batches(n: int, batch: int, data: list[str]) -> tuple[BertConfig, list[dict]]:
    """bert_mini and `n` training batches of the bundled sample as `train.py <data>` makes
    them."""
    dm = configured("data", [*data, f"data.batch_size={batch}"], out_dir=None)
    tok = dm.build_tokenizer()
    dm.setup("fit")
    c = replace(
        model_config("bert_mini", tok.get_vocab_size()), pad_token_id=special_ids(tok)["[PAD]"]
    )
    loader = iter(dm.train_dataloader())
    return c, [next(loader) for _ in range(n)]


class Classifier(torch.nn.Module):
    """A fine-tuning head's step as `FinetuneModule` takes it: logits, then the task's loss."""

    def __init__(self, model, loss):
        super().__init__()
        self.model, self.loss_fn = model, loss

    def forward(self, labels, **batch):
        out = self.model(**batch)
        logits = out if torch.is_tensor(out) else out.logits
        return SimpleNamespace(loss=self.loss_fn(logits.float(), labels))


class Across(torch.nn.Module):
    """A model on packed_isolated batches without their position ids (plain packing); for
    `transformers`, the MLM loss as `BertForMaskedLM` takes it (no NSP labels here)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, labels, position_ids=None, mlm_positions=None):
        if isinstance(self.model, BertForPreTraining):
            return self.model(input_ids, labels=labels, mlm_positions=mlm_positions)
        logits = self.model(input_ids).prediction_logits  # (B, T, V)
        return SimpleNamespace(loss=F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()))


def bce(logits, labels):
    return F.binary_cross_entropy_with_logits(logits[:, 0], labels)


def hf_classifier(ours, num_labels: int):
    import transformers

    cfg = transformers.BertConfig(
        **{k: v for k, v in ours.config.to_dict().items() if k != "pre_layer_norm"},
        num_labels=num_labels,
        attn_implementation="sdpa",
    )
    hf = transformers.BertForSequenceClassification(cfg)
    hf.load_state_dict(ours_to_hf(ours.state_dict()), strict=False)
    return hf


def workload(name: str, n: int, batch: int, g):
    """(models by mode, batches) of a workload; the modes share their initial weights."""
    torch.manual_seed(0)
    if name in ("home_depot_cross", "home_depot_bi", "sst2"):
        batches = (
            sentence_batches(n, batch, MINILM, g)
            if name == "sst2"
            else pair_batches(n, batch, 48, MINILM, g)
        )
        if name == "home_depot_bi":
            ours = BertBiEncoder(MINILM, "mean")
            return {"ours": Classifier(ours, bce), "ours_padded": Classifier(ours, bce)}, batches
        labels, loss = (2, F.cross_entropy) if name == "sst2" else (1, bce)
        ours = BertForSequenceClassification(MINILM, labels, "cls")
        theirs = hf_classifier(ours, labels)
        models = {"ours": Classifier(ours, loss), "ours_padded": Classifier(ours, loss)}
        return models | {"transformers": Classifier(theirs, loss)}, batches
    if name == "nsp":
        c, batches = corpus_batches(n, batch, ["data=c4_nsp"])
    elif name == "packed_isolated":
        c, batches = corpus_batches(n, batch, ["data.packing=packed_isolated"])
        ours = BertForPreTraining(c)
        return {
            "ours": ours,
            "ours_padded": Across(ours),
            "transformers": Across(hf_model(ours)),
        }, batches
    else:  # packed
        c = model_config("bert_mini")
        batches = [random_batch(c, batch, 128, "cpu", seed=i) for i in range(n)]
    ours = BertForPreTraining(c)
    return {"ours": ours, "ours_padded": ours, "transformers": hf_model(ours)}, batches


def inputs(mode: str, model, batch: dict) -> dict:
    """What a mode's model is called with: `transformers` without our `mlm_positions`; our
    padded path with `unpad=False` (packed_isolated's "padded" column, `Across`, is about
    position ids: its blocks have no padding)."""
    if mode == "transformers":
        return without_positions(batch)
    if mode == "ours_padded" and not isinstance(model, Across):
        return batch | {"unpad": False}
    return batch


def bench(name: str, args, device, dtype) -> dict:
    g = torch.Generator().manual_seed(0)
    models, batches = workload(name, args.batches, args.batch_size, g)
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    steps = {}
    for mode, model in models.items():
        model.to(device).train()
        opt = configured("optim", ["optim.lr=1e-5"])(model, 1)["optimizer"]
        fns = [make_step(model, opt, inputs(mode, model, b), dtype) for b in batches]

        def step(fns=fns):
            step.i = (step.i + 1) % len(fns)
            fns[step.i]()

        step.i = -1
        steps[mode] = step
    for fn in steps.values():
        for _ in range(args.warmup):
            fn()
    times, order = {k: [] for k in steps}, list(steps)
    for i in range(args.steps):  # each mode first in turn: no mode always follows another
        for k in order[i % len(order) :] + order[: i % len(order)]:
            times[k].append(timed(steps[k], device))
    med = {k: statistics.median(v) for k, v in times.items()}
    masks = [b.get("attention_mask", torch.ones_like(b["input_ids"])) for b in batches]
    pad = 1 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)
    real = sum(int(m.sum()) for m in masks) / len(masks)  # real tokens per batch
    return {
        "workload": name,
        "dtype": "bf16" if dtype else "fp32",
        "padding": pad,
        **{f"{k}_tok_s": real / v for k, v in med.items()},
        "vs_padded": med["ours_padded"] / med["ours"],
        "vs_transformers": med["transformers"] / med["ours"] if "transformers" in med else None,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    every = ["home_depot_cross", "home_depot_bi", "sst2", "nsp", "packed", "packed_isolated"]
    p.add_argument("--workloads", nargs="+", default=every, choices=every)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=8, help="distinct batches cycled through")
    p.add_argument("--steps", type=int, default=12, help="timed steps of each")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--no-bf16", action="store_true")
    p.add_argument("--json", help="also write the rows to this JSON file (bench/gpu_check.sh)")
    args = p.parse_args()
    device = torch.device(args.device)
    print(
        f"device {device}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        "real tokens/s, median of each; speed-ups of ours (unpadded)"
    )
    head = ["workload", "dtype", "padding", "ours", "ours, padded", "transformers"]
    head += ["vs padded", "vs transformers"]
    print("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
    rows = []
    for name in args.workloads:
        for dtype in [None] + ([] if args.no_bf16 else [torch.bfloat16]):
            rows.append(r := bench(name, args, device, dtype))
            hf = r.get("transformers_tok_s")
            vs = r["vs_transformers"]
            print(
                f"| {name} | {r['dtype']} | {r['padding']:.0%} | {r['ours_tok_s']:,.0f} | "
                f"{r['ours_padded_tok_s']:,.0f} | {f'{hf:,.0f}' if hf else '-'} | "
                f"{r['vs_padded']:.2f}x | {f'{vs:.2f}x' if vs else '-'} |",
                flush=True,
            )
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
