"""The brackets sanity suite: textbook BERT claims, reproduced through `train(cfg)` on the toy.

`python -m bert_lightning.experiments.brackets OUT_DIR` trains the variants with the real
`train.py` path (`experiment=brackets` plus overrides), evaluates each checkpoint on fresh masked
sentences, prints the tables beside the numbers a published tutorial reports, and saves plots.
"""

from __future__ import annotations

import argparse
import csv
import re
from dataclasses import asdict
from pathlib import Path

import torch
from tokenizers import Tokenizer

from bert_lightning.atomic import write_json
from bert_lightning.config import compose
from bert_lightning.data.brackets import (
    brackets_tokenizer,
    sentences,
    to_input_ids,
    write_grammar_data,
)
from bert_lightning.data.masking import MaskingConfig, MLMCollator, picked_positions
from bert_lightning.inference import load_mlm
from bert_lightning.model import BertForPreTraining
from bert_lightning.training.callbacks import save_figure
from bert_lightning.training.finetune import finetune

# name -> (train.py overrides, the overrides of the masking used for evaluation)
VARIANTS = {
    "bidirectional": ([], []),
    "causal": (["model.is_decoder=true"], []),
    # evaluated on 80/10/10 data: kept positions exist only there
    "always_mask": (["data.masking.p_mask=1.0", "data.masking.p_random=0.0"], []),
    "mlm_0.5": (["data.masking.mlm_probability=0.5"], ["data.masking.mlm_probability=0.5"]),
    "mlm_0": (["data.masking.mlm_probability=0.0"], []),
}

# name -> finetune.py overrides (`{ckpt}`: the bidirectional run's last checkpoint); the
# experiment max-pools the last layer, the last row classifies from [CLS] as the tutorial did
FINETUNE_VARIANTS = {
    "frozen encoder, head only": ["init_from={ckpt}", "freeze_encoder=true"],
    "fine-tuned from pretrained": ["init_from={ckpt}"],
    "from a random encoder": [],
    "fine-tuned from pretrained, [CLS]": ["init_from={ckpt}", "task.pooling=cls"],
}

# what the tutorial reports for this setup (percent)
REPORTED = {
    "stats": {"[MASK]": 12.0, "random": 1.5, "kept": 1.5, "picked": 15.0},
    "bidirectional": {"overall": 89.4, "partner intact": 99.9, "partner hidden": 18.3},
    "causal": {"overall": 55.5, "closers": 89.7, "openers": 20.4},
    "kept": {"80/10/10": 99.3, "always [MASK]": 53.0},
    "mlm_0.5": 64.2,
    "mlm_0": {"loss at step 1": 0.0, "accuracy": 8.3},
    "finetune": {
        "frozen encoder, head only": 51.8,
        "fine-tuned from pretrained": 99.2,
        "from a random encoder": 50.1,
        "fine-tuned from pretrained, [CLS]": 99.2,
    },
}


def brackets_masking(overrides: list[str]) -> MaskingConfig:
    """The masking `experiment=brackets` trains with, under `overrides`."""
    cfg = compose(overrides=["experiment=brackets", "paths.output_dir=.", *overrides])
    return MaskingConfig(**cfg.data.masking)


def masking_stats(n: int = 10_000, seed: int = 0) -> dict[str, float]:
    """Shares of real tokens over `n` masked sentences, from the training collator itself."""
    tok = brackets_tokenizer()
    g = torch.Generator().manual_seed(seed)
    ids = to_input_ids(sentences(n, 8, g), tok)  # (n, 17)
    collator = MLMCollator.for_tokenizer(tok, brackets_masking([]))
    inputs, labels = collator.mask(ids, g)
    real = collator.maskable(ids)
    picked = labels != -100
    mask = picked & (inputs == tok.token_to_id("[MASK]"))
    kept = picked & (inputs == ids)
    n_real = int(real.sum())
    return {
        "[MASK]": 100 * int(mask.sum()) / n_real,
        "random": 100 * int((picked & ~mask & ~kept).sum()) / n_real,
        "kept": 100 * int(kept.sum()) / n_real,
        "picked": 100 * int(picked.sum()) / n_real,
        "real tokens": n_real,
    }


@torch.no_grad()
def evaluate(
    model: BertForPreTraining,
    tokenizer: Tokenizer,
    masking: MaskingConfig,
    n: int = 5_000,
    seed: int = 99,
) -> dict[str, float]:
    """Masked-token accuracy (percent) overall and split by what the position became
    ([MASK] / random / kept), by role (opener / closer) and by whether the partner of the pair
    is visible and intact."""
    model.eval()
    g = torch.Generator().manual_seed(seed)
    ids = to_input_ids(sentences(n, 8, g), tokenizer)  # (n, 17)
    inputs, labels = MLMCollator.for_tokenizer(tokenizer, masking).mask(ids, g)
    picked = labels != -100  # (n, 17)
    if not picked.any():
        return {}
    out = model(inputs, labels=labels, mlm_positions=picked_positions(labels))
    at = out.mlm_labels != -100  # (B * K,) the picks, in row-major order
    correct = out.mlm_logits[at].argmax(-1) == out.mlm_labels[at]  # (P,)
    rows, pos = picked.nonzero(as_tuple=True)  # (P,), (P,)
    opener = (pos - 1) % 2 == 0  # symbols start after [CLS]: openers at odd positions
    partner = torch.where(opener, pos + 1, pos - 1)
    intact = inputs[rows, partner] == ids[rows, partner]
    became = inputs[picked]
    groups = {
        "overall": torch.ones_like(correct),
        "[MASK]": became == tokenizer.token_to_id("[MASK]"),
        "kept": became == ids[picked],
        "openers": opener,
        "closers": ~opener,
        "partner intact": intact,
        "partner hidden": ~intact,
    }
    groups["random"] = ~groups["[MASK]"] & ~groups["kept"]
    return {
        k: 100 * correct[m].float().mean().item() if m.any() else float("nan")
        for k, m in groups.items()
    }


def train_variant(out_dir: Path, overrides: list[str], extra: list[str]) -> Path:
    """One `python train.py experiment=brackets ...` run, in process; its last checkpoint."""
    from bert_lightning.config import compose
    from bert_lightning.training.pretrain import train

    cfg = compose(
        overrides=["experiment=brackets", f"paths.output_dir={out_dir}", *overrides, *extra]
    )
    train(cfg)
    return out_dir / "checkpoints" / "last.ckpt"


def finetune_variant(out_dir: Path, overrides: list[str], extra: list[str]) -> float:
    """One `python finetune.py experiment=brackets_grammar ...` run, in process: test accuracy
    (percent) of its best checkpoint."""
    from bert_lightning.config import compose

    write_grammar_data(out_dir.parent / "brackets_grammar_data")  # what the experiment reads
    cfg = compose(
        "finetune",
        [
            "experiment=brackets_grammar",
            f"paths.output_dir={out_dir}",
            f"paths.log_dir={out_dir.parent}",
            *overrides,
            *extra,
        ],
    )
    return 100 * finetune(cfg)["test"]["test/acc"]


def logged(run_dir: Path, key: str) -> list[tuple[int, float]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [(int(r["step"]), float(r[key])) for r in csv.DictReader(f) if r.get(key)]


def run_all(out_dir: Path, extra: list[str] | None = None, variants=None, finetunes=None) -> dict:
    """Train and evaluate the variants (and, from the bidirectional checkpoint, the fine-tuning
    set); results (percent) by variant, plus masking stats. `extra` overrides every run;
    `variants` / `finetunes` pick names of VARIANTS / FINETUNE_VARIANTS (None: all)."""
    tok = brackets_tokenizer()
    results: dict = {"stats": masking_stats()}
    quiet = [o for o in extra or [] if o.startswith("trainer.enable_")]
    for name in variants or VARIANTS:
        overrides, eval_overrides = VARIANTS[name]
        eval_masking = brackets_masking(eval_overrides)
        ckpt = train_variant(out_dir / name, overrides, extra or [])
        results[name] = evaluate(load_mlm(ckpt)[0], tok, eval_masking)
        results[name]["first train loss"] = logged(out_dir / name, "train/loss")[0][1]
        results[name]["masking"] = asdict(eval_masking)
    if "bidirectional" in results:
        ckpt = out_dir / "bidirectional" / "checkpoints" / "last.ckpt"
        results["finetune"] = {
            name: finetune_variant(
                out_dir / "finetune" / re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_"),
                [o.format(ckpt=ckpt) for o in overrides],
                quiet,
            )
            for name, overrides in FINETUNE_VARIANTS.items()
            if finetunes is None or name in finetunes
        }
    return results


def tables(r: dict) -> str:
    """The five tables of the tutorial with our numbers beside the reported ones."""
    rep = REPORTED
    lines = ["", "1. masking statistics over 10,000 sentences (% of real tokens)"]
    lines += [
        f"   {k:<16} ours {r['stats'][k]:5.1f}   reported {v:5.1f}" for k, v in rep["stats"].items()
    ]
    rows = [
        ("2. bidirectional", "bidirectional", ["overall", "partner intact", "partner hidden"]),
        ("3. causal", "causal", ["overall", "closers", "openers"]),
    ]
    for title, name, keys in rows:
        if name in r:
            lines += ["", f"{title}: masked-token accuracy (%)"]
            lines += [
                f"   {k:<16} ours {r[name][k]:5.1f}   reported {rep[name][k]:5.1f}" for k in keys
            ]
    if "always_mask" in r and "bidirectional" in r:
        lines += ["", "4. 80/10/10 ablation"]
        lines.append(
            f"   kept-position acc, 80/10/10      ours {r['bidirectional']['kept']:5.1f}"
            f"   reported {rep['kept']['80/10/10']:5.1f}"
        )
        lines.append(
            f"   kept-position acc, always [MASK] ours {r['always_mask']['kept']:5.1f}"
            f"   reported {rep['kept']['always [MASK]']:5.1f}"
        )
    if "mlm_0.5" in r:
        lines.append(
            f"   mlm_probability=0.5, own data    ours {r['mlm_0.5']['overall']:5.1f}"
            f"   reported {rep['mlm_0.5']:5.1f}"
        )
    if "mlm_0" in r:
        lines.append(
            f"   mlm_probability=0: loss at step 1 ours {r['mlm_0']['first train loss']:5.2f}"
            f"   reported {rep['mlm_0']['loss at step 1']:5.2f};"
            f" accuracy ours {r['mlm_0']['overall']:5.1f} reported {rep['mlm_0']['accuracy']:5.1f}"
        )
    if "finetune" in r:
        lines += [
            "",
            "5. fine-tuning on the grammar task, 300 steps: test accuracy (%)",
            "   (ours: last layer max-pooled, but the last row; reported: all from [CLS])",
        ]
        lines += [
            f"   {k:<34} ours {v:5.1f}   reported {rep['finetune'][k]:5.1f}"
            for k, v in r["finetune"].items()
        ]
    return "\n".join(lines)


def plot(out_dir: Path, r: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("bidirectional", "causal"):
        if (out_dir / name / "metrics.csv").is_file():
            steps, losses = zip(*logged(out_dir / name, "train/loss"), strict=True)
            ax.plot(steps, losses, label=name)
    ax.set(xlabel="step", ylabel="train MLM loss", title="brackets: bidirectional vs causal")
    if ax.lines:
        ax.legend()
    save_figure(fig, out_dir / "brackets_loss_curves.png")

    kinds = ["[MASK]", "random", "kept", "openers", "closers"]
    names = [n for n in ("bidirectional", "causal", "always_mask") if n in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        ax.bar(
            [k + i * width for k in range(len(kinds))],
            [r[name][k] for k in kinds],
            width,
            label=name,
        )
    ax.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(kinds))], kinds)
    ax.set(ylabel="masked-token accuracy (%)", ylim=(0, 100), title="accuracy by token kind")
    ax.legend(loc="upper left", bbox_to_anchor=(1, 1))
    save_figure(fig, out_dir / "brackets_accuracy_by_kind.png")
    plt.close("all")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir", nargs="?", default="outputs/brackets_report")
    p.add_argument("overrides", nargs="*", help="extra train.py overrides for every variant")
    args = p.parse_args(argv)
    out = Path(args.out_dir)
    results = run_all(out, args.overrides)
    print(tables(results))
    write_json(results, out / "results.json")
    plot(out, results)
    print(f"\nresults.json and plots in {out}")
    return results


if __name__ == "__main__":
    main()
