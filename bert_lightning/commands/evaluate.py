"""`bert-lightning evaluate CKPT FILE`: a checkpoint's metrics on any file.

A fine-tuned checkpoint: its task's metrics on a file in the task's format, as fine-tuning tests
(the task's reading, encoding, loss and metrics; `inference.task_metrics`, no Lightning), so the
numbers are those `results.json` holds for a test file. A pretraining checkpoint
(or a Hugging Face folder with an MLM head): MLM loss, masked-token accuracy and perplexity on
a corpus, read, framed (an NSP run's: paired, its loss MLM + NSP) and masked once with a seed as
its run's validation data were."""

from __future__ import annotations

from dataclasses import asdict
from functools import partial

from bert_lightning.atomic import write_json
from bert_lightning.choices import PACKINGS, SCORE_BATCH
from bert_lightning.commands.options import (
    add_column_argument,
    add_table_arguments,
    at_least_one,
    table_options,
    task_options,
)
from bert_lightning.errors import UserError

name = lambda c: f"{c.__module__}.{c.__qualname__}"  # as a record names a data module
# the `data` settings a validation loss depends on: the data module that makes the examples,
# how files are read, how examples are framed (NSP: paired) and masked (a batch's seed)
VALIDATION_KEYS = (
    "_target_",
    *("text_unit", "max_doc_chars", "long_docs", "on_bad_record"),
    *("max_seq_length", "packing", "short_seq_prob", "dupe_factor", "nsp"),
    *("batch_size", "seed", "masking", "max_eval_samples"),
)


def evaluate_mlm(
    path,
    files,
    max_seq_length: int | None = None,
    packing: str | None = None,
    seed: int | None = None,
    batch_size: int | None = None,
    mlm_probability: float | None = None,
    cache_dir: str | None = None,
    progress=False,
    pre=None,
) -> dict:
    """MLM loss, masked-token accuracy and perplexity of a checkpoint with an MLM head on a
    corpus (files, folders, globs), as its pretraining run validated: how files are read,
    length, framing (an NSP run's pairs and loss), batch size, seed and masking are the ones
    its checkpoint's data record holds (`VALIDATION_KEYS`; each given value overrides them; a
    checkpoint without the record, e.g. a Hugging Face folder, takes `conf/data`'s defaults),
    so the same files give the run's numbers. `pre`: the checkpoint at `path`, read already."""
    from omegaconf import OmegaConf

    from bert_lightning.checkpoint import read_checkpoint
    from bert_lightning.config import compose
    from bert_lightning.data.brackets import BracketsDataModule
    from bert_lightning.data.nsp import NSPDataModule
    from bert_lightning.data.pretraining import PretrainDataModule
    from bert_lightning.data.streaming import StreamingDataModule
    from bert_lightning.inference import check_mlm_head
    from bert_lightning.training.instantiate import check_types, instantiate
    from bert_lightning.training.pretrain_module import BertPretrainModule
    from bert_lightning.training.trainer import evaluation_trainer
    from bert_lightning.weights import load_weights

    # the data modules that frame files as a run's validation did; the others' runs (streamed
    # blocks, the toy corpus) are validated as `conf/data`'s default frames files
    framed = [name(c) for c in (PretrainDataModule, NSPDataModule)]
    recorded = [*framed, *map(name, (StreamingDataModule, BracketsDataModule))]
    pre = pre or read_checkpoint(path)
    record = pre.data_record or {}
    ran = {k: record[f"data.{k}"] for k in VALIDATION_KEYS if f"data.{k}" in record}
    if ran and "_target_" not in ran:  # settings of a data module the record does not name
        raise UserError(f"{path}: data_record has no data._target_ (the data module it records)")
    given = {
        "max_seq_length": max_seq_length,
        "packing": packing,
        "seed": seed,
        "batch_size": batch_size,
    }
    data = compose(overrides=["paths.output_dir=.", "trainer.accelerator=cpu"]).data
    values = {k: data[k] for k in VALIDATION_KEYS if k in data}  # `seed` read in place: ${seed}
    shipped = {
        k: OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for k, v in values.items()
    }
    settings = shipped | ran | {k: v for k, v in given.items() if v is not None}
    # the data module the record names, compared with the package's own, never imported
    if (target := settings.pop("_target_")) not in recorded:
        raise UserError(
            f"{path}: data_record data._target_={target!r}: not a data module of "
            f"bert_lightning ({', '.join(recorded)})"
        )
    if target in framed:
        data._target_ = target
    check_types(settings | {"_target_": data._target_}, f"{path}: data_record data")
    if mlm_probability is not None:
        settings["masking"] = {**settings["masking"], "mlm_probability": mlm_probability}
    max_len = min(settings["max_seq_length"], pre.config.max_position_embeddings)
    settings |= {"max_seq_length": max_len, "train_files": None, "val_files": files}
    dm = instantiate(data, "data", cache_dir=cache_dir, out_dir=None, **settings)
    dm.build_tokenizer(pre.tokenizer)
    dm.setup()
    if len(dm.val_set) == 0:
        raise UserError(
            f"{' '.join(dm.val_files)}: too little text for one {dm.packing} example of "
            f"{max_len} tokens (--packing document frames every document, however short)"
        )
    module = BertPretrainModule(asdict(pre.config), {}, pre.tokenizer.to_str(), nsp=dm.nsp)
    check_mlm_head(path, pre, "evaluate")
    load_weights(module.model, pre)
    metrics = evaluation_trainer(progress).validate(module, dm.val_dataloader(), verbose=False)[0]
    out = {"examples": len(dm.val_set)}
    return out | {k.removeprefix("val/"): float(v) for k, v in metrics.items() if "/" in k}


def register(sub) -> None:
    p = sub.add_parser(
        "evaluate",
        help="a checkpoint's metrics on a file: its task's (fine-tuned) or MLM loss (pretrained)",
        description=" ".join(__doc__.split("\n\n", 1)[1].split()),
    )
    p.add_argument("model", help="a .ckpt from finetune.py or train.py, or a Hugging Face folder")
    p.add_argument("file", nargs="+", help="a task file (fine-tuned) or corpus files (pretrained)")
    p.add_argument("--json", metavar="OUT", help="also write the metrics as JSON to OUT")
    p.add_argument(
        "--batch-size",
        type=at_least_one,
        help=f"default: {SCORE_BATCH} (fine-tuned); the run's (pretrained)",
    )
    p.add_argument(
        "--max-seq-length",
        type=at_least_one,
        help="default: the fine-tuning length (fine-tuned); the run's (pretrained)",
    )
    add_table_arguments(p)
    add_column_argument(
        p,
        "fine-tuned: query, ad, label, group for ad relevance; text, text_pair, label, group "
        "for sentence tasks; default: the columns the model was fine-tuned on",
    )
    p.add_argument(
        "--grades",
        metavar="MIN,MAX",
        help="graded ad relevance: the range of this file's labels (default: the model's)",
    )
    p.add_argument(
        "--zero-shot",
        metavar="ENCODER",
        help="ranking tasks: also the zero-shot cosine of this encoder (a .ckpt or Hugging Face "
        "folder, e.g. the one fine-tuning started from) as a baseline beside BM25",
    )
    mlm = p.add_argument_group(
        "pretrained checkpoints (default: the data.* values the checkpoint's run validated "
        "with, as its checkpoint records them)"
    )
    mlm.add_argument("--packing", choices=PACKINGS)
    mlm.add_argument("--seed", type=int, help="of the masks")
    mlm.add_argument("--mlm-probability", type=float)
    mlm.add_argument("--cache-dir", help="the datasets cache (default: HF_DATASETS_CACHE)")
    p.set_defaults(func=_main)


def _main(args) -> None:
    from bert_lightning.checkpoint import FINETUNING, read_checkpoint
    from bert_lightning.inference import load_finetuned, task_metrics, zero_shot_cosines
    from bert_lightning.ort import is_exported
    from bert_lightning.progress import Waiting, on_terminal
    from bert_lightning.tasks.ranking import ranking_table

    pre = None if is_exported(args.model) else read_checkpoint(args.model)  # ONNX: fine-tuned
    origin = pre.origin if pre else FINETUNING
    if origin == FINETUNING:
        if len(args.file) > 1:
            raise UserError(f"{args.model}: a fine-tuned checkpoint is evaluated on one file")
        ft = load_finetuned(args.model, "evaluate", pre)
        ft = ft.with_table_options(table_options(args) | task_options(args, ft.task))
        length = args.max_seq_length or ft.max_seq_length
        zero_shot = None
        if args.zero_shot:
            zero_shot = partial(zero_shot_cosines, args.zero_shot, max_seq_length=length)
        with Waiting(f"{args.model} on {args.file[0]}"):  # off a terminal: a line, not a bar
            metrics = task_metrics(
                ft, args.file[0], args.batch_size or SCORE_BATCH, length, on_terminal(), zero_shot
            )
    else:
        metrics = evaluate_mlm(
            args.model, args.file, args.max_seq_length, args.packing, args.seed,
            args.batch_size, args.mlm_probability, args.cache_dir, progress=True, pre=pre,
        )  # fmt: skip
    numbers = {k: v for k, v in metrics.items() if not isinstance(v, dict)}
    width = max(map(len, numbers))
    print(f"{args.model} ({origin}) on {' '.join(args.file)}")
    for k, v in numbers.items():
        print(f"  {k:<{width}}  {v:.6g}" if isinstance(v, float) else f"  {k:<{width}}  {v}")
    for who, m in metrics.get("baselines", {}).items():
        print(f"  {who}: " + ", ".join(f"{k.removeprefix('test/')} {v:.4f}" for k, v in m.items()))
    if "ranking" in metrics:
        print(ranking_table(metrics["ranking"]))
    if args.json:
        out = {"model": args.model, "files": args.file, "kind": origin, "metrics": metrics}
        write_json(out, args.json)
        print(f"wrote {args.json}")
