"""Ranking Home Depot's catalogue from cached vectors (`bert-lightning index`, `serve --index`):
every distinct product title of train.csv.zip encoded once, then queries ranked against it.

    python bench/rank_catalogue.py --data-dir ../shared/data/home_depot
    python bench/rank_catalogue.py --data-dir DIR --model path/to/best.ckpt --seconds 20

The default model is the recipe's start, all-MiniLM-L6-v2 under an untrained bi-encoder head
(its zero-shot cosine; `--model` a fine-tuned bi-encoder). It measures, in one run on one
machine: the index's build time and vectors/s, and an HNSW graph's over the same vectors (`index
--hnsw 32`); `/rank` latency (p50, p99) for one query's top 10 of the whole catalogue (exact and
HNSW search, the query encoded by PyTorch or by the int8 ONNX export) and for 100 given ids, at
1 and 16 clients; HNSW's recall@10 of exact search's; the int8 query encoder's score error;
`/rank`'s requests/s against `/score`'s on the same 100 (query, title) pairs, each request
scoring all 100; and retrieval over the whole catalogue for the recipe's test queries:
recall@10 and recall@100 of each query's judged-relevant titles (grade >= 2.5), beside BM25
over the same titles, with a paired bootstrap interval of the difference."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import torch
from loadtest import minilm_folder, p99, relevance_ckpt, server

from bert_lightning.catalogue import (
    indexed_pair_scores,
    ranked,
    read_index,
    text_vectors,
    write_index,
)
from bert_lightning.cli import main as cli
from bert_lightning.config import compose
from bert_lightning.inference import load_finetuned
from bert_lightning.tasks.ranking import interval
from bert_lightning.training.finetune import task_tables

RELEVANT = 2.5  # a judged-relevant title: a grade of 2.5 or more (1 to 3)
HNSW_M = 32  # the HNSW index's links per title (`bert-lightning index --hnsw 32`)


def catalogue(data_dir: Path) -> pd.DataFrame:
    """Every distinct title of train.csv.zip, its id the first product_uid it has (a product_uid
    with several titles: `uid`, `uid-2`, ...)."""
    rows = pd.read_csv(data_dir / "train.csv.zip", encoding="latin-1", dtype=str)
    first = rows.drop_duplicates("product_title")
    uid = first["product_uid"]
    n = uid.groupby(uid).cumcount()  # 0 for a uid's first title
    ids = uid.where(n == 0, uid + "-" + (n + 1).astype(str))
    return pd.DataFrame({"id": ids.tolist(), "ad": first["product_title"].tolist()})


def test_queries(data_dir: Path) -> dict[str, set[str]]:
    """The recipe's test split (its queries cut whole from train.csv.zip, as `finetune.py
    experiment=home_depot_minilm` cuts them): each query's judged-relevant titles."""
    cfg = compose("finetune", ["experiment=home_depot_minilm", f"data_dir={data_dir}"])
    task, tables = task_tables(cfg)
    test, c = tables["test"], task.cfg
    least = (RELEVANT - c.grade_min) / (c.grade_max - c.grade_min)  # the grade as a target
    relevant: dict[str, set[str]] = {}
    for q, title, target in zip(test["text"], test["pair"], test["target"], strict=True):
        if target >= least - 1e-9:
            relevant.setdefault(q, set()).add(title)
    return relevant


def recalls(ranked: list[list[str]], relevant: list[set[str]], k: int) -> np.ndarray:
    """(Q,) the share of each query's relevant titles among its first `k`."""
    return np.array(
        [len(set(r[:k]) & rel) / len(rel) for r, rel in zip(ranked, relevant, strict=True)]
    )


def retrieval(ft, index, relevant: dict[str, set[str]]) -> dict:
    """recall@10 and @100 of the model and of BM25 over the catalogue's titles, and their
    paired differences with bootstrap intervals."""
    import bm25s

    queries = list(relevant)
    wanted = [relevant[q] for q in queries]
    ours, tok = [], ft.tokenizer()
    for start in range(0, len(queries), 256):
        q = text_vectors(ft.model, tok, queries[start : start + 256])  # (B, H)
        _, rows = ranked(ft, index, q, 100)  # (B, 100)
        ours += [[index.ads[r] for r in row] for row in rows.tolist()]
    bm25 = bm25s.BM25()
    bm25.index(bm25s.tokenize(index.ads, show_progress=False), show_progress=False)
    k = min(100, len(index.ads))  # a tiny catalogue: all of it
    found, _ = bm25.retrieve(bm25s.tokenize(queries, show_progress=False), k=k, show_progress=False)
    theirs = [[index.ads[r] for r in row] for row in found.tolist()]
    out = {"queries": len(queries)}
    for k in (10, 100):
        a, b = recalls(ours, wanted, k), recalls(theirs, wanted, k)
        out[f"recall@{k}"] = {
            "model": interval(a),
            "bm25": interval(b),
            "model - bm25": interval(a - b),
        }
    return out


def hnsw_recall(ft, exact, hnsw, queries: list[str]) -> float:
    """The share of exact search's top 10 that HNSW finds, over `queries`."""
    q = text_vectors(ft.model, ft.tokenizer(), queries)  # (Q, H)
    a, b = ranked(ft, exact, q, 10)[1].tolist(), ranked(ft, hnsw, q, 10)[1].tolist()
    return round(float(np.mean([len(set(x) & set(y)) / 10 for x, y in zip(a, b, strict=True)])), 4)


def int8_error(ft, ft8, index, given: list[dict]) -> dict:
    """|score| differences of the int8 ONNX query encoder's scores against PyTorch's, over the
    (query, id) rows of `given` (both from the index's fp32 vectors): p50, p99, max."""
    queries = [b["query"] for b in given for _ in b["ids"]]
    ids = [i for b in given for i in b["ids"]]
    a, b = (indexed_pair_scores(f, index, queries, ids) for f in (ft, ft8))
    d = np.sort((a - b).abs().numpy())
    at = {"p50": np.median(d), "p99": d[int(0.99 * (len(d) - 1))], "max": d[-1]}
    return {"rows": len(d)} | {k: round(float(v), 5) for k, v in at.items()}


async def latencies(url: str, route: str, bodies: list[dict], clients: int, seconds: float) -> dict:
    """`clients` loops posting `bodies` in turn for `seconds`: p50, p99 (ms) and requests/s."""
    done, errors = [], 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:
        stop = time.perf_counter() + seconds

        async def client(i: int) -> None:
            nonlocal errors
            rng = random.Random(i)
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await http.post(route, json=rng.choice(bodies))
                done.append((time.perf_counter() - t) * 1000)
                errors += r.status_code != 200

        start = time.perf_counter()
        await asyncio.gather(*(client(i) for i in range(clients)))
        wall = time.perf_counter() - start
    done.sort()
    return {
        "p50_ms": round(statistics.median(done), 1),
        "p99_ms": p99(done),
        "requests_per_s": round(len(done) / wall, 1),
        "requests": len(done),
        "errors": errors,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data-dir", required=True, help="the folder of Home Depot's train.csv.zip")
    p.add_argument("--model", help="a fine-tuned bi-encoder (default: the recipe's start)")
    p.add_argument("--seconds", type=float, default=15, help="of load per measurement")
    p.add_argument("--json", default="bench/results/rank_catalogue.json")
    args = p.parse_args()
    data_dir, work = Path(args.data_dir), Path(tempfile.mkdtemp())
    start = ["task.architecture=bi_encoder", "task.pooling=mean", "data.max_seq_length=48"]
    model = args.model or str(relevance_ckpt(minilm_folder(), work / "bi.ckpt", *start))
    ft = load_finetuned(model)
    ads = catalogue(data_dir)
    ads.to_csv(work / "catalogue.csv", index=False)
    t = time.perf_counter()
    cli(["index", model, str(work / "catalogue.csv"), str(work / "index")])
    built = time.perf_counter() - t
    index = read_index(work / "index")
    vectors = torch.from_numpy(index.vectors)
    write_index(ft, model, index.ids, index.ads, vectors, work / "hnsw", hnsw_m=HNSW_M)
    hnsw = read_index(work / "hnsw")
    t = time.perf_counter()
    assert hnsw.searcher.ntotal == len(ads)  # the graph, built as a worker builds it at load
    graph = time.perf_counter() - t
    out = {"model": args.model or "all-MiniLM-L6-v2, untrained bi-encoder head (zero-shot)",
           "catalogue": len(ads), "index_s": round(built, 1),
           "vectors_per_s": round(len(ads) / built, 1),
           "hnsw": {"m": HNSW_M, "ef_search": hnsw.record["ef_search"],
                    "graph_s": round(graph, 1)}}  # fmt: skip
    relevant = test_queries(data_dir)
    out["retrieval"] = retrieval(ft, index, relevant)
    out["hnsw"]["recall@10_of_exact"] = hnsw_recall(ft, index, hnsw, list(relevant))
    print(json.dumps(out, indent=2), flush=True)
    rng = random.Random(0)
    queries = rng.sample(list(relevant), min(200, len(relevant)))
    candidates = [rng.sample(index.ids, min(100, len(index.ids))) for _ in queries]
    title = dict(zip(index.ids, index.ads, strict=True))
    top10 = [{"query": q, "k": 10} for q in queries]
    given = [{"query": q, "ids": ids} for q, ids in zip(queries, candidates, strict=True)]
    pairs = [{"pairs": [{"query": q, "ad": title[i]} for i in ids]}
             for q, ids in zip(queries, candidates, strict=True)]  # fmt: skip
    with server(model, work / "server.log", "--index", str(work / "index")) as (url, _):
        load = {}
        for clients in (1, 16):
            routes = [("rank_top10", "/rank", top10), ("rank_100_ids", "/rank", given)]
            routes.append(("score_100_pairs", "/score", pairs))
            for name, route, bodies in routes:
                stats = asyncio.run(latencies(url, route, bodies, clients, args.seconds))
                load[f"{name}_{clients}_clients"] = stats
                print(name, clients, stats, flush=True)
        out["rank_vs_score_requests_per_s"] = {
            c: round(load[f"rank_100_ids_{c}_clients"]["requests_per_s"]
                     / load[f"score_100_pairs_{c}_clients"]["requests_per_s"], 1)
            for c in (1, 16)
        }  # fmt: skip
    int8 = work / "int8"
    cli(["export-onnx", model, str(int8), "--quantize", "int8"])
    out["int8_query_score_error"] = int8_error(ft, load_finetuned(str(int8)), index, given)
    for name, encoder, ix in [
        ("rank_top10_hnsw", model, "hnsw"),
        ("rank_top10_int8", str(int8), "index"),
        ("rank_top10_int8_hnsw", str(int8), "hnsw"),
    ]:
        with server(encoder, work / f"{name}.log", "--index", str(work / ix)) as (url, _):
            for clients in (1, 16):
                stats = asyncio.run(latencies(url, "/rank", top10, clients, args.seconds))
                load[f"{name}_{clients}_clients"] = stats
                print(name, clients, stats, flush=True)
    out["load"] = load
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
