"""Soak test of `bert-lightning serve`: `--clients` concurrent clients for `--minutes`, a share
of their requests bad (`--bad-share`: bodies the server must refuse with a 4xx: a blank pair,
a missing field, a number for a text, too many pairs, not JSON), the rest one (query, title)
pair each, as bench/serve.py sends them. Per minute: requests/s and p99 of the good ones,
errors (a good request not answered 200, a bad one answered other than 4xx, a connection
failure), and the RSS of every process of the server (a leak shows as growth).

    python bench/serve_soak.py                       # 10 minutes, 16 clients, a fifth bad
    python bench/serve_soak.py --model best.ckpt --minutes 30 --json soak.json

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
from pathlib import Path

import httpx
from serve import (
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
    latencies, errors, bad_sent = [], 0, 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        stop = time.perf_counter() + seconds

        async def client(i: int) -> None:
            nonlocal errors, bad_sent
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
                except httpx.HTTPError:
                    errors += 1
                    continue
                if bad:
                    bad_sent += 1
                    errors += not 400 <= r.status_code < 500
                elif r.status_code != 200:
                    errors += 1
                else:
                    latencies.append(time.perf_counter() - t)

        await asyncio.gather(*(client(i) for i in range(clients)))
    ms = sorted(x * 1000 for x in latencies)
    return {
        "good": len(ms),
        "bad": bad_sent,
        "errors": errors,
        "requests_per_s": round((len(ms) + bad_sent) / seconds, 1),
        "p99_ms": p99(ms),
    }


def main() -> None:
    p = load_parser(__doc__, "serve_soak.json")
    p.add_argument("--minutes", type=int, default=10)
    p.add_argument("--seconds-per-minute", type=float, default=60, help="(tests shorten it)")
    p.add_argument("--bad-share", type=float, default=0.2)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(relevance_ckpt(minilm_folder(), Path(tmp) / "minilm.ckpt"))
        pairs = home_depot_pairs(read_checkpoint(model).tokenizer)
        with server(model, Path(tmp) / "server.log") as (url, pid):
            start_rss = tree_rss(pid)
            for m in range(args.minutes):
                load = minute(url, pairs, args.clients, args.seconds_per_minute, args.bad_share, m)
                row = {"minute": m + 1, **asyncio.run(load)}
                row["rss_mib"] = {str(k): round(v, 1) for k, v in tree_rss(pid).items()}
                rows.append(row)
                print(json.dumps(row), flush=True)
    growth = {
        pid: round(rows[-1]["rss_mib"].get(pid, 0) - rows[0]["rss_mib"][pid], 1)
        for pid in rows[0]["rss_mib"]
    }
    summary = {
        "model": args.model or "all-MiniLM-L6-v2 + untrained ad_relevance head",
        "clients": args.clients,
        "bad_share": args.bad_share,
        "errors": sum(r["errors"] for r in rows),
        "requests_per_s_median": statistics.median(r["requests_per_s"] for r in rows),
        "rss_at_start_mib": {str(k): round(v, 1) for k, v in start_rss.items()},
        "rss_growth_first_to_last_minute_mib": growth,
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
        f"\n{summary['errors']} errors; RSS growth from the first to the last minute, per "
        f"process (MiB): {growth}; wrote {args.json}"
    )


if __name__ == "__main__":
    main()
