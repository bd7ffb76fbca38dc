"""`bert-lightning export-hf CKPT OUT_DIR`: a checkpoint of ours -> a Hugging Face folder (a
fine-tuned bi-encoder's: a sentence-transformers folder)."""

from __future__ import annotations


def export_hf(ckpt_path: str, out_dir: str, overwrite: bool = False) -> str:
    """A fine-tuned model exports with what is applied after its head (a regression's target
    scale, folded into it) and the length it was fine-tuned on (`model_max_length`); a Hugging
    Face folder keeps its head's labels, problem type, target scale and length. A bi-encoder
    (`task.architecture=bi_encoder`), which no `transformers` class computes, is written as
    sentence-transformers reads a model, with its score head beside it."""
    from bert_lightning.checkpoint import FINETUNING, HUGGING_FACE, read_checkpoint
    from bert_lightning.inference import fine_tuned_length
    from bert_lightning.interop import (
        CLASSIFIER,
        export_hf_folder,
        hf_folder_head,
        sentence_transformers_files,
    )
    from bert_lightning.tasks.kinds import hf_head

    ckpt = read_checkpoint(ckpt_path)
    task = ckpt.hparams["task"] if ckpt.origin == FINETUNING else {}
    kept, length = hf_folder_head(ckpt_path) if ckpt.origin == HUGGING_FACE else ({}, None)
    regression = task.get("kind") == "regression"
    length = fine_tuned_length(ckpt) if task else length
    state, head, extra = ckpt.state_dict, None, None
    if task.get("architecture") == "bi_encoder":  # the encoder, and the head beside it
        extra = sentence_transformers_files(state, task, length, ckpt.config.hidden_size)
        state = {k: v for k, v in state.items() if k not in CLASSIFIER}
    elif task:
        head = hf_head(task)
    return str(
        export_hf_folder(
            state,
            ckpt.config,
            ckpt.tokenizer,
            out_dir,
            head=head,
            labels=task.get("labels"),
            overwrite=overwrite,
            target_scale=(task["target_mean"], task["target_std"]) if regression else None,
            max_seq_length=length,
            kept=kept,
            extra=extra,
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
