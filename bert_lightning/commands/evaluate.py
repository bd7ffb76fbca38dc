"""`bert-lightning evaluate CKPT FILE`: a checkpoint's metrics on any file.

A fine-tuned checkpoint: its task's metrics on a file in the task's format, through the code
fine-tuning tests with (the task's reading, encoding and metrics, the FinetuneModule's test
step), so the numbers are those `results.json` holds for a test file. A pretraining checkpoint
(or a Hugging Face folder with an MLM head): MLM loss, masked-token accuracy and perplexity on
a corpus, framed and masked once with a seed as pretraining's validation data are."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

import lightning as L
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from bert_lightning.atomic import write_json
from bert_lightning.checkpoint import FINETUNING, read_checkpoint
from bert_lightning.data.mlm import PretrainDataModule
from bert_lightning.data.pipeline import PACKINGS
from bert_lightning.data.tables import collate
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.errors import UserError
from bert_lightning.inference import add_table_arguments, load_mlm, table_options
from bert_lightning.training.callbacks import EvalProgressBar
from bert_lightning.training.finetune_module import FinetuneModule
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.trainer import silence_noise

DEFAULT_MAX_SEQ_LENGTH = 128  # conf/data/c4_sample.yaml's
DEFAULT_SEED = 1234  # conf/train.yaml's: the validation masks of a default pretraining run


def _trainer(progress: bool) -> L.Trainer:
    """`progress`: ours, whose lines off a terminal read as a run's (not Lightning's Rich bar)."""
    silence_noise()  # Lightning's advertisement and deprecation notices of a bare Trainer
    return L.Trainer(
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        callbacks=[EvalProgressBar()] if progress else None,
    )


def evaluate_finetuned(
    module, path, options: dict | None = None, batch_size=64, max_seq_length=None, progress=False
) -> dict:
    """The task's metrics (and loss) of a FinetuneModule on a file; `options`: table keys
    (format, encoding, header, names) over the task's own."""
    task = module.task
    task.cfg.update(options or {})
    tok = Tokenizer.from_str(module.tokenizer_json)
    feats = task.encode(
        task.prepare(task.read(path)), tok, max_seq_length or module.hparams.max_seq_length
    )
    loader = DataLoader(
        feats, batch_size, collate_fn=partial(collate, pad_id=special_ids(tok)["[PAD]"])
    )
    metrics = _trainer(progress).test(module, loader, verbose=False)[0]
    return {"rows": len(feats)} | {k.removeprefix("test/"): float(v) for k, v in metrics.items()}


def evaluate_mlm(
    path,
    files,
    max_seq_length: int | None = None,
    packing: str = "packed",
    seed: int = DEFAULT_SEED,
    batch_size: int = 32,
    mlm_probability: float = 0.15,
    cache_dir: str | None = None,
    progress=False,
    pre=None,
) -> dict:
    """MLM loss, masked-token accuracy and perplexity of a checkpoint with an MLM head on a
    corpus (files, folders, globs), as pretraining validates (same seed, framing and batch
    size: same numbers). `pre`: the checkpoint at `path`, read already."""
    pre = pre or read_checkpoint(path)
    model, tok = load_mlm(path, pre)
    max_len = max_seq_length or min(DEFAULT_MAX_SEQ_LENGTH, pre.config.max_position_embeddings)
    dm = PretrainDataModule(
        train_files=None,
        val_files=files,
        max_seq_length=max_len,
        packing=packing,
        batch_size=batch_size,
        masking={"mlm_probability": mlm_probability},
        cache_dir=cache_dir,
        seed=seed,
    )
    dm.tokenizer = tok
    dm.val_set = dm.held_out(dm.val_files)
    if len(dm.val_set) == 0:
        raise UserError(
            f"{' '.join(dm.val_files)}: too little text for one {packing} example of {max_len} "
            "tokens (--packing document frames every document, however short)"
        )
    module = BertPretrainModule(asdict(pre.config), {}, tok.to_str(), objective="mlm")
    module.model.load_state_dict(model.state_dict())
    metrics = _trainer(progress).validate(module, dm.val_dataloader(), verbose=False)[0]
    out = {"examples": len(dm.val_set)}
    return out | {k.removeprefix("val/"): float(v) for k, v in metrics.items()}


def register(sub) -> None:
    p = sub.add_parser(
        "evaluate",
        help="a checkpoint's metrics on a file: its task's (fine-tuned) or MLM loss (pretrained)",
        description=" ".join(__doc__.split("\n\n", 1)[1].split()),
    )
    p.add_argument("model", help="a .ckpt from finetune.py or train.py, or a Hugging Face folder")
    p.add_argument("file", nargs="+", help="a task file (fine-tuned) or corpus files (pretrained)")
    p.add_argument("--json", metavar="OUT", help="also write the metrics as JSON to OUT")
    p.add_argument("--batch-size", type=int, help="default: 64 (fine-tuned), 32 (pretrained)")
    p.add_argument(
        "--max-seq-length",
        type=int,
        help="default: the fine-tuning length (fine-tuned); 128 (pretrained)",
    )
    add_table_arguments(p)
    mlm = p.add_argument_group("pretrained checkpoints (the pretraining run's data.* values)")
    mlm.add_argument("--packing", choices=PACKINGS, default="packed")
    mlm.add_argument("--seed", type=int, default=DEFAULT_SEED, help="of the masks")
    mlm.add_argument("--mlm-probability", type=float, default=0.15)
    mlm.add_argument("--cache-dir", help="the datasets cache (default: HF_DATASETS_CACHE)")
    p.set_defaults(func=_main)


def _main(args) -> None:
    pre = read_checkpoint(args.model)
    if pre.kind == FINETUNING:
        if len(args.file) > 1:
            raise UserError(f"{args.model}: a fine-tuned checkpoint is evaluated on one file")
        module = FinetuneModule.from_checkpoint(args.model, pre=pre)
        metrics = evaluate_finetuned(
            module, args.file[0], table_options(args), args.batch_size or 64,
            args.max_seq_length, progress=True,
        )  # fmt: skip
    else:
        metrics = evaluate_mlm(
            args.model, args.file, args.max_seq_length, args.packing, args.seed,
            args.batch_size or 32, args.mlm_probability, args.cache_dir, progress=True, pre=pre,
        )  # fmt: skip
    width = max(map(len, metrics))
    print(f"{args.model} ({pre.kind}) on {' '.join(args.file)}")
    for k, v in metrics.items():
        print(f"  {k:<{width}}  {v:.6g}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    if args.json:
        out = {"model": args.model, "files": args.file, "kind": pre.kind, "metrics": metrics}
        write_json(out, args.json)
        print(f"wrote {args.json}")
