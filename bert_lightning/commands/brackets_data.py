"""`bert-lightning brackets-data [FOLDER]`: writes the brackets grammar task (train, validation,
test JSONL and the brackets tokenizer) that `finetune.py experiment=brackets_grammar` reads.
An explicit step, so that composing a config never writes files."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("brackets-data", help="write the brackets grammar task's files")
    p.add_argument(
        "folder",
        nargs="?",
        default="outputs/brackets_grammar_data",
        help="experiment=brackets_grammar reads ${paths.log_dir}/brackets_grammar_data/seed0",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_main)


def _main(args) -> None:
    from bert_lightning.data.brackets import write_grammar_data

    print(write_grammar_data(args.folder, args.seed))
