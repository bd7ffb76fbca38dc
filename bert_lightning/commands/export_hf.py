"""`bert-lightning export-hf CKPT OUT_DIR`: a checkpoint of ours -> a Hugging Face folder."""

from __future__ import annotations

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.interop import export_hf_folder
from bert_lightning.tasks.kinds import hf_head


def export_hf(ckpt_path: str, out_dir: str, overwrite: bool = False) -> str:
    ckpt = read_checkpoint(ckpt_path)
    task = ckpt.hparams.get("task")
    task = task if isinstance(task, dict) else {}
    return str(
        export_hf_folder(
            ckpt.state_dict,
            ckpt.config,
            ckpt.tokenizer,
            out_dir,
            head=hf_head(task) if task else None,
            labels=task.get("labels"),
            overwrite=overwrite,
        )
    )


def register(sub) -> None:
    p = sub.add_parser(
        "export-hf",
        help="write a checkpoint as a Hugging Face folder (config.json, model.safetensors, "
        "tokenizer files) that transformers' from_pretrained loads",
    )
    p.add_argument("ckpt", help="a .ckpt written by train.py or finetune.py")
    p.add_argument("out_dir", help="the folder to create")
    p.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    p.set_defaults(func=lambda a: print(export_hf(a.ckpt, a.out_dir, a.overwrite)))
