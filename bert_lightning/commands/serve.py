"""`bert-lightning serve`: a model over HTTP, requests of concurrent clients batched into one
forward pass (LitServe, an optional dependency: `pip install 'bert-lightning[serve]'`).
`POST /score` (a fine-tuned checkpoint), `POST /embed` (any), `POST /fill-mask` (an MLM head),
`POST /rank` (a bi-encoder with `--index`), `GET /health`; docs/serving.md says what each takes
and returns."""

from __future__ import annotations

import importlib.util

from bert_lightning.errors import UserError


def register(sub) -> None:
    p = sub.add_parser("serve", help="serve /score, /embed, /fill-mask over HTTP (LitServe)")
    p.add_argument("model", help="a .ckpt of ours (fine-tuned: /score) or a Hugging Face folder")
    hosts = ["127.0.0.1", "0.0.0.0", "::"]  # what LitServer.run binds
    p.add_argument("--host", default="127.0.0.1", choices=hosts)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--max-batch-size", type=int, default=32, help="requests answered by one forward pass"
    )
    p.add_argument(
        "--batch-timeout", type=float, default=0.01, help="seconds a batch waits to fill"
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument(
        "--threads", type=int, help="torch threads per worker (default: one core fewer than all)"
    )
    p.add_argument(
        "--grace",
        type=float,
        default=20.0,
        help="after SIGTERM or Ctrl+C, seconds the requests in flight get to finish",
    )
    p.add_argument(
        "--index", help="a bi-encoder's index of a catalogue (bert-lightning index): /rank"
    )
    p.set_defaults(func=_main)


def _main(args) -> None:
    # checked before the checkpoint is read: the server module imports litserve at the top
    if importlib.util.find_spec("litserve") is None:
        raise UserError("bert-lightning serve needs litserve: pip install 'bert-lightning[serve]'")
    from bert_lightning.serving import serve

    serve(
        args.model,
        args.host,
        args.port,
        args.max_batch_size,
        args.batch_timeout,
        args.device,
        args.threads,
        args.grace,
        args.index,
    )
