"""Soak test of `bert-lightning serve`: `--clients` concurrent clients for `--minutes`, a share
of their requests bad (`--bad-share`: bodies the server must refuse with a 4xx: a blank pair,
a missing field, a number for a text, too many pairs, not JSON), the rest one (query, title)
pair each, as bench/serve.py sends them. Per minute: requests/s and p99 of the good ones,
errors (a good request not answered 200, a bad one answered other than 4xx, a connection
failure; `error_kinds` says which), and the RSS of every process of the server (a leak
shows as growth, counted from the end of `--warmup-minutes`, while allocator caches fill).

    python bench/serve_soak.py                       # 10 minutes, 16 clients, a fifth bad
    python bench/serve_soak.py --model best.ckpt --minutes 60 --backend int8 --json soak.json

The model, pairs and server are bench/serve.py's; the clients (httpx, asyncio, one process)
share the machine with the server. Prints a Markdown table and writes every figure to
`--json`."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from loadtest import (
    backend_model,
    home_depot_pairs,
    load_parser,
    minilm_folder,
    p99,
    relevance_ckpt,
    server,
    tree_rss,
)

from bert_lightning.checkpoint import read_checkpoint

BAD = [  # bodies /score must refuse with a 4xx
    {"pairs": [{"query": "", "ad": "cordless drill"}]},
    {"pairs": [{"query": "drill"}]},
    {"pairs": [{"query": 7, "ad": "cordless drill"}]},
    {"pairs": [{"query": "drill", "ad": "cordless drill"}] * 257},
    "{not json",
]


async def minute(url: str, pairs: list, clients: int, seconds: float, bad_share: float, seed):
    """One period of load: the good requests' latencies and the errors."""
    latencies, errors, bad_sent = [], Counter(), 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        stop = time.perf_counter() + seconds

        async def client(i: int) -> None:
            nonlocal bad_sent
            rng = random.Random(seed * 1000 + i)
            while time.perf_counter() < stop:
                bad = rng.random() < bad_share
                if bad:
                    body = rng.choice(BAD)
                    kwargs = {"content": body} if isinstance(body, str) else {"json": body}
                    if isinstance(body, str):
                        kwargs["headers"] = {"content-type": "application/json"}
                else:
                    q, a = rng.choice(pairs)
                    kwargs = {"json": {"pairs": [{"query": q, "ad": a}]}}
                t = time.perf_counter()
                try:
                    r = await http.post("/score", **kwargs)
                except httpx.HTTPError as e:
                    errors[type(e).__name__] += 1  # ReadTimeout, ConnectError, ...
                    continue
                if bad:
                    bad_sent += 1
                    if not 400 <= r.status_code < 500:
                        errors[f"bad body answered {r.status_code}"] += 1
                elif r.status_code != 200:
                    errors[f"good body answered {r.status_code}"] += 1
                else:
                    latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(client(i) for i in range(clients)))
    ms = sorted(x * 1000 for x in latencies)
    return {
        "good": len(ms),
        "bad": bad_sent,
        "errors": sum(errors.values()),
        "error_kinds": dict(errors),
        "requests_per_s": round((len(ms) + bad_sent) / seconds, 1),
        "p99_ms": p99(ms),
    }


def main() -> None:
    p = load_parser(__doc__, "serve_soak.json")
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--seconds-per-minute", type=float, default=60, help="(tests shorten it)")
    p.add_argument("--bad-share", type=float, default=0.2)
    p.add_argument("--backend", default="torch", help="torch, onnx or int8 (as bench/serve.py)")
    p.add_argument("--warmup-minutes", type=int, default=5, help="growth is counted after them")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(relevance_ckpt(minilm_folder(), Path(tmp) / "minilm.ckpt"))
        pairs = home_depot_pairs(read_checkpoint(model).tokenizer)
        served = backend_model(args.backend, model, Path(tmp))
        with server(served, Path(tmp) / "server.log") as (url, pid):
            start_rss = tree_rss(pid)
            for m in range(args.minutes):
                load = minute(url, pairs, args.clients, args.seconds_per_minute, args.bad_share, m)
                row = {"minute": m + 1, **asyncio.run(load)}
                row["rss_mib"] = {str(k): round(v, 1) for k, v in tree_rss(pid).items()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    warm_minute = min(args.warmup_minutes, len(rows))
    warm = rows[warm_minute - 1]["rss_mib"]
    growth = {
        pid: [
            round(rows[-1]["rss_mib"].get(pid, 0) - mib, 1),
            round(100 * (rows[-1]["rss_mib"].get(pid, 0) / mib - 1), 2),
        ]
        for pid, mib in warm.items()
    }
    summary = {
        "model": args.model or "all-MiniLM-L6-v2 + untrained ad_relevance head",
        "backend": args.backend,
        "clients": args.clients,
        "bad_share": args.bad_share,
        "errors": sum(r["errors"] for r in rows),
        "requests_per_s_median": statistics.median(r["requests_per_s"] for r in rows),
        "rss_at_start_mib": {str(k): round(v, 1) for k, v in start_rss.items()},
        "warmup_minutes": args.warmup_minutes,
        "rss_growth_after_warmup_mib_and_percent": growth,
        "rows": rows,
    }
    Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    header = ["minute", "requests/s", "p99 ms (good)", "good", "bad (4xx)", "errors"]
    print("| " + " | ".join(header) + " | RSS MiB, each process |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rss = " / ".join(f"{v:.0f}" for v in r["rss_mib"].values())
        cells = [r["minute"], r["requests_per_s"], r["p99_ms"], r["good"], r["bad"], r["errors"]]
        print("| " + " | ".join(map(str, cells)) + f" | {rss} |")
    print(
        f"\n{summary['errors']} errors; RSS growth from minute {warm_minute} to the last, per "
        f"process (MiB, %): {growth}; wrote {args.json}"
    )


if __name__ == "__main__":
    main()
