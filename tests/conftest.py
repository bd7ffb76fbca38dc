import json
import os
from pathlib import Path

import pytest
import torch

from bert_lightning.config import bundled
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.tokenizer import train_wordpiece

SAMPLE = bundled("c4_sample.jsonl")
OPTIM = {
    "_target_": "bert_lightning.training.optim.adamw",
    "_partial_": True,
    "lr": 1e-3,
}  # conf/optim


def tiny_overrides(out_dir: Path, *extra: str) -> list[str]:
    """A train.py run small enough for a unit test: width 32, 2 layers, seq 32, vocab 600."""
    return [
        f"paths.output_dir={out_dir}",
        f"data.cache_dir={out_dir / 'hf_cache'}",
        "model.hidden_size=32",
        "model.num_hidden_layers=2",
        "model.num_attention_heads=2",
        "model.intermediate_size=64",
        "data.max_seq_length=32",
        "data.batch_size=8",
        "data.val_docs=5",
        "data.tokenizer.vocab_size=600",
        "data.tokenizer.max_docs=100",
        f"data.train_files={out_dir / 'corpus.jsonl'}",
        "trainer.accelerator=cpu",
        "trainer.max_steps=6",
        "trainer.val_check_interval=3",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        *extra,
    ]


def write_corpus(path: Path, n_docs: int = 60) -> Path:
    """The first `n_docs` documents of the bundled C4 sample, as a standalone file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i, text in enumerate(iter_documents([SAMPLE])):
            if i == n_docs:
                break
            f.write(json.dumps({"text": text, "url": f"u{i}"}) + "\n")
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer():
    docs = list(iter_documents([SAMPLE]))[:200]
    return train_wordpiece(lambda: iter(docs), vocab_size=800)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# tiny models gain nothing from intra-op threads, and lose a lot on a busy machine
torch.set_num_threads(1)


os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach a hub
os.environ.setdefault("WANDB_SILENT", "true")
