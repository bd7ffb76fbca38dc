"""Load test of `bert-lightning serve` /score (issue #21): N concurrent clients for T seconds,
each sending one (query, title) pair per request, against a server batching them; then the
baseline, one client and `--max-batch-size 1` (one request per forward pass).

    python bench/serve.py                          # 16 clients, 60 s, each setup
    python bench/serve.py --model path/to/best.ckpt --clients 32 --seconds 30
    python bench/serve.py --backends torch,onnx,int8 --rounds 3   # PyTorch and ONNX Runtime
    python bench/serve.py --backends int8 --vs student=DIR --rounds 3  # another encoder too

The default model is an ad_relevance cross-encoder as finetune.py writes it: all-MiniLM-L6-v2's
encoder with an untrained head. Its scores mean nothing, but its forward pass is a fine-tuned
one's, which is all a load test measures. Pairs have Home Depot's lengths: query and title
word pieces drawn from steps.py's percentiles (median 6 and 19 with [CLS]/[SEP]), each a
word of one piece. The server runs on the CPU in its own process tree; the clients (httpx,
asyncio, one process) share the machine with it. RSS: the sum over the server's processes
(shared pages counted in each), before and after the load. Targets: >= 2x the baseline's
requests/s, p99 <= 250 ms, no errors. `--vs NAME=PATH` serves another encoder (a Hugging Face
folder or a checkpoint) under the same untrained head, each backend of it in the same rounds:
its requests/s over the model's, round by round."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from loadtest import (
    backend_model,
    home_depot_pairs,
    load_parser,
    minilm_folder,
    p99,
    paired_median,
    relevance_ckpt,
    server,
    tree_rss_mib,
)

from bert_lightning.checkpoint import read_checkpoint


async def load(url: str, pairs: list, clients: int, seconds: float) -> dict:
    """`clients` loops, each posting one pair and waiting for its score, for `seconds`."""
    latencies, batches, errors = [], [], 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        start = time.perf_counter()
        stop = start + seconds

        async def client(i: int) -> None:
            nonlocal errors
            rng = random.Random(i)
            while time.perf_counter() < stop:
                q, a = rng.choice(pairs)
                t = time.perf_counter()
                try:
                    r = await http.post("/score", json={"pairs": [{"query": q, "ad": a}]})
                    ok = r.status_code == 200 and len(r.json()["scores"]) == 1
                except httpx.HTTPError:
                    ok = False
                if not ok:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - t)
                batches.append(int(r.headers["x-batch-size"]))

        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
    ms = sorted(x * 1000 for x in latencies)
    return {
        "requests": len(ms),
        "errors": errors,
        "seconds": round(elapsed, 2),
        "requests_per_s": round(len(ms) / elapsed, 1),
        "p50_ms": round(statistics.median(ms), 1) if ms else None,
        "p99_ms": p99(ms),
        "mean_batch": round(statistics.mean(batches), 2) if batches else None,
    }


def run_setup(name, model, pairs, clients, max_batch, timeout, args, log) -> dict:
    options = ["--max-batch-size", str(max_batch), "--batch-timeout", str(timeout)]
    options += ["--threads", str(args.threads)] if args.threads else []
    with server(model, log, *options) as (url, pid):
        rss_before = tree_rss_mib(pid)
        asyncio.run(load(url, pairs, clients, args.warmup))  # first calls: allocator, caches
        result = asyncio.run(load(url, pairs, clients, args.seconds))
        rss_after = tree_rss_mib(pid)
    return {
        "setup": name,
        "clients": clients,
        "max_batch_size": max_batch,
        "batch_timeout": timeout,
        **result,
        "rss_before_mib": round(rss_before),
        "rss_after_mib": round(rss_after),
    }


COLUMNS = [  # (header, key)
    ("setup", "setup"),
    ("clients", "clients"),
    ("max batch", "max_batch_size"),
    ("batch timeout s", "batch_timeout"),
    ("requests/s", "requests_per_s"),
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("errors", "errors"),
    ("mean batch", "mean_batch"),
    ("server RSS MiB before / after", None),
]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        cells = [
            str(r[k]) if k else f"{r['rss_before_mib']} / {r['rss_after_mib']}" for _, k in COLUMNS
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = load_parser(__doc__, "serve_bench.json")
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--warmup", type=float, default=3, help="seconds of load before measuring")
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--batch-timeout", type=float, default=0.01)
    p.add_argument("--threads", type=int, help="the server's --threads (default: its own)")
    p.add_argument(
        "--backends",
        default="torch",
        help="served batched, comma-separated: torch, onnx (ONNX Runtime fp32), int8 (ONNX "
        "Runtime int8), each an export-onnx folder of the model; the one-at-a-time baseline "
        "is torch's",
    )
    p.add_argument("--rounds", type=int, default=1, help="round r starts with backend r")
    p.add_argument("--vs", help="NAME=PATH: another encoder under the same head, same backends")
    args = p.parse_args()
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(relevance_ckpt(minilm_folder(), Path(tmp) / "minilm.ckpt"))
        served = {b: backend_model(b, model, Path(tmp)) for b in backends}
        if args.vs:
            name, _, path = args.vs.partition("=")
            other = relevance_ckpt(Path(path), Path(tmp) / f"{name}.ckpt")
            served |= {
                f"{b}, {name}": backend_model(b, str(other), Path(tmp) / name) for b in backends
            }
        tok = read_checkpoint(model).tokenizer
        pairs = home_depot_pairs(tok)
        batched = (args.clients, args.max_batch_size, args.batch_timeout)
        rows, setups = [], list(served)
        for r in range(args.rounds):
            for b in setups[r % len(setups) :] + setups[: r % len(setups)]:
                log = Path(tmp) / f"{len(rows)}.log"
                rows.append(run_setup(f"batched, {b}", served[b], pairs, *batched, args, log))
        log = Path(tmp) / "one.log"
        rows.append(run_setup("one at a time, torch", model, pairs, 1, 1, 0.0, args, log))
    medians = {
        b: {
            k: statistics.median(r[k] for r in rows if r["setup"] == f"batched, {b}")
            for k in ("requests_per_s", "p50_ms", "p99_ms")
        }
        for b in setups
    }
    per_round = rounds_of(rows[:-1], len(setups))
    first = medians[backends[0]]
    ratio = first["requests_per_s"] / max(rows[-1]["requests_per_s"], 1e-9)
    summary = {
        "model": args.model or "all-MiniLM-L6-v2 + untrained ad_relevance head",
        "mean_pair_pieces": round(statistics.mean(len(tok.encode(q, a).ids) for q, a in pairs), 1),
        "server_threads": args.threads or "the server's default",
        "speedup": round(ratio, 2),
        "medians": medians,
        **ratios(per_round, setups, len(backends)),
        "targets_met": ratio >= 2
        and (first["p99_ms"] or 1e9) <= 250
        and all(r["errors"] == 0 for r in rows),
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(table(rows))
    met = "met" if summary["targets_met"] else "NOT met"
    print(
        f"\nbatched ({backends[0]}) / one at a time: {ratio:.2f}x requests/s; pairs of "
        f"{summary['mean_pair_pieces']} word pieces on average; targets (>= 2x, p99 <= 250 ms, "
        f"0 errors) {met}; medians per backend {medians}; requests/s over the model's, "
        f"round by round: {summary['requests_per_s_vs_model']}; wrote {args.json}"
    )


def ratios(per_round: list[dict], setups: list[str], n_backends: int) -> dict:
    """Each setup's requests/s over torch's (None without torch) and, for the `--vs` encoder's
    setups (after the model's `n_backends`), over the model's on the same backend: medians of
    the rounds' own ratios."""
    over = lambda b, of: paired_median([x[b] for x in per_round], [x[of] for x in per_round])
    return {
        "requests_per_s_vs_torch": {b: over(b, "torch") for b in setups}
        if "torch" in setups
        else None,
        "requests_per_s_vs_model": {b: over(b, b.split(", ")[0]) for b in setups[n_backends:]},
    }


def rounds_of(rows: list[dict], n: int) -> list[dict]:
    """The batched rows, one dict {setup: requests/s} per round of `n` setups."""
    return [
        {r["setup"].removeprefix("batched, "): r["requests_per_s"] for r in rows[i : i + n]}
        for i in range(0, len(rows), n)
    ]


if __name__ == "__main__":
    main()
