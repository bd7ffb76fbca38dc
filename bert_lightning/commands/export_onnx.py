"""`bert-lightning export-onnx MODEL OUT_DIR`: a checkpoint or Hugging Face folder as it is used
(a fine-tuned head, or an embedding model with its pooling) -> an ONNX folder that `score`,
`embed`, `evaluate` and `serve` run with ONNX Runtime (`bert_lightning/ort.py`)."""

from __future__ import annotations

import json

from bert_lightning.choices import EMBED_LENGTH, EXPORT_POOLING, POOLINGS
from bert_lightning.commands.options import at_least_one


def register(sub) -> None:
    p = sub.add_parser(
        "export-onnx",
        help="write a model as it is used (fine-tuned head, or embeddings) as an ONNX folder "
        "that score, embed, evaluate and serve run with ONNX Runtime",
        description=" ".join(__doc__.split("\n\n", 1)[0].split()),
    )
    p.add_argument("model", help="a .ckpt of ours or a Hugging Face folder")
    p.add_argument("out_dir", help="the folder to create")
    p.add_argument(
        "--quantize", choices=["int8"], help="int8 weights of the Linear layers (dynamic)"
    )
    p.add_argument(
        "--fp32-top",
        type=int,
        default=0,
        help="with --quantize int8: the top N layers and the head stay fp32 (scores nearer "
        "PyTorch's, a little slower)",
    )
    p.add_argument(
        "--pooling",
        choices=[k for k in POOLINGS if k != "last4"],
        help="an embedding model's (not fine-tuned) pooling (default: a sentence-transformers "
        f"folder's declared one, of unit length if it normalizes; else {EXPORT_POOLING})",
    )
    p.add_argument(
        "--max-seq-length", type=at_least_one, help=f"an embedding model's (default {EMBED_LENGTH})"
    )
    p.add_argument("--overwrite", action="store_true", help="replace OUT_DIR if it exists")
    p.set_defaults(func=_main)


def _main(args) -> None:
    from bert_lightning.onnx_export import export_onnx
    from bert_lightning.ort import SPEC

    out = export_onnx(
        args.model,
        args.out_dir,
        quantize=args.quantize,
        pooling=args.pooling,
        max_seq_length=args.max_seq_length,
        overwrite=args.overwrite,
        fp32_top=args.fp32_top,
    )
    spec = json.loads((out / SPEC).read_text())
    unit = ", unit length" if spec.get("normalize") else ""
    what = spec.get("head") or f"embeddings ({spec['pooling']}{unit})"
    size = (out / "model.onnx").stat().st_size / 2**20
    print(f"wrote {out}: {what}, {spec['quantized'] or 'fp32'}, {size:.1f} MiB")
