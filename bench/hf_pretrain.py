"""The same pretraining budget spent by `transformers`: `BertForMaskedLM` (sdpa, its dense MLM
head) with its `DataCollatorForLanguageModeling`, on the tokenizer, data, model shape, precision,
optimizer and time budget of one of our configs, then written as a Hugging Face folder that
`bert-lightning downstream` fine-tunes beside ours.

    python bench/hf_pretrain.py OUT_FOLDER experiment=cpu_30min [train.py overrides...]

The config is composed as `python train.py OVERRIDES` would (`trainer.max_time` is the budget);
the tokenizer is trained the same way on the same documents, so it is the same tokenizer. The
loop: AdamW from `training/optim.py` (the same parameter groups, fused), the learning rate on
the same budget schedule (linear decay as the time runs out), gradient clipping at
`trainer.gradient_clip_val`, bf16 autocast under `bf16-mixed`; the clock runs over the whole
loop, data loading included, as Lightning's Timer does for ours. At the end it prints the
validation MLM loss on our held-out, once-masked blocks and writes `OUT_FOLDER/summary.json`.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from omegaconf import OmegaConf
from steps import hf_collator
from torch.utils.data import DataLoader

from bert_lightning.atomic import write_json
from bert_lightning.config import compose
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.interop import export_hf_folder, hf_to_ours
from bert_lightning.training.instantiate import instantiate
from bert_lightning.training.optim import adamw


def seconds(max_time) -> float:
    """`trainer.max_time` as Lightning reads it: DD:HH:MM:SS or a timedelta's fields."""
    if isinstance(max_time, str):
        d, h, m, s = (int(x) for x in max_time.split(":"))
        return timedelta(days=d, hours=h, minutes=m, seconds=s).total_seconds()
    return timedelta(**max_time).total_seconds()


@torch.no_grad()
def val_loss(model, dm, autocast) -> float:
    """Mean MLM loss over the picked tokens of our held-out, once-masked blocks."""
    model.eval()
    total = count = 0.0
    for batch in dm.val_dataloader():
        with autocast():
            logits = model(
                input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask")
            ).logits  # (B, T, V)
        labels = batch["labels"]
        total += float(
            torch.nn.functional.cross_entropy(
                logits.float().flatten(0, 1), labels.flatten(), reduction="sum"
            )
        )
        count += int((labels != -100).sum())
    model.train()
    return total / count


def main(out: Path, overrides: list[str]) -> dict:
    import transformers

    cfg = compose("train", [f"paths.output_dir={out}", *overrides])
    budget = seconds(OmegaConf.to_container(cfg.trainer, resolve=True)["max_time"])
    L.seed_everything(cfg.seed)
    dm = instantiate(cfg.data, "data", out_dir=str(out))
    tok = dm.build_tokenizer()
    dm.setup("fit")
    config = instantiate(
        cfg.model, "model", vocab_size=tok.get_vocab_size(), pad_token_id=special_ids(tok)["[PAD]"]
    )
    if config.pre_layer_norm:
        sys.exit("model.pre_layer_norm=true: transformers' BERT has post-LN blocks only")
    hf_cfg = transformers.BertConfig(**asdict(config), attn_implementation="sdpa")
    model = transformers.BertForMaskedLM(hf_cfg).train()
    loader = DataLoader(
        dm.train_set,
        batch_size=dm.batch_size,
        shuffle=True,
        collate_fn=hf_collator(tok, dm.masking.mlm_probability),
    )
    resolved = OmegaConf.to_container(cfg.optim, resolve=True)  # the start's schedule drawn
    optim = {k: v for k, v in resolved.items() if not k.startswith("_")}
    start = time.perf_counter()
    spent = lambda: (time.perf_counter() - start) / budget  # noqa: E731
    built = adamw(model, 0, progress=spent, **optim)
    opt, sched = built["optimizer"], built["lr_scheduler"]["scheduler"]
    bf16 = str(cfg.trainer.precision).startswith("bf16")
    autocast = (lambda: torch.autocast("cpu", torch.bfloat16)) if bf16 else nullcontext
    clip = cfg.trainer.gradient_clip_val
    steps = tokens = 0
    print(f"transformers BertForMaskedLM, {asdict(config)}, budget {budget:.0f} s", flush=True)
    while spent() < 1.0:
        for batch in loader:
            with autocast():
                loss = model(**batch).loss
            loss.backward()
            if clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
            tokens += int(batch["attention_mask"].sum())
            if steps % 100 == 0:
                print(f"step {steps} loss {loss.item():.3f} spent {spent():.1%}", flush=True)
            if spent() >= 1.0:
                break
    elapsed = time.perf_counter() - start
    summary = {
        "steps": steps,
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        "val_loss": val_loss(model, dm, autocast),
        "config": overrides,
    }
    state = hf_to_ours({k: v for k, v in model.state_dict().items()})
    export_hf_folder(state, config, tok, out / "hf_model", overwrite=True)
    write_json(summary, out / "summary.json")
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), sys.argv[2:])
