"""Baselines beside an ad relevance fine-tune, scored on the same test rows with the same
threshold-free metrics (AUROC, Spearman, NDCG@10), so a user sees what fine-tuning added:

- `bm25`: BM25 (bm25s, Lucene's variant, k1=1.5, b=0.75) of each row's query against its ad,
  the documents being the distinct ad texts of the test rows (lower-cased word tokens);
- `zero_shot`: the cosine of the STARTING encoder's mean-pooled last-layer embeddings of the
  query and of the ad, each encoded alone (how sentence-transformers models such as
  all-MiniLM-L6-v2 are meant to be used), before any fine-tuning: what the untrained
  `task.architecture=bi_encoder` head computes, so the same code."""

from __future__ import annotations

import logging
import re

import bm25s
import numpy as np
import torch

from bert_lightning.inference import cosines, load_bi_encoder
from bert_lightning.tasks.ad_relevance import AdRelevance

THRESHOLD_FREE = ("auroc", "spearman", "ndcg@10")


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def bm25_scores(queries: list[str], ads: list[str]) -> torch.Tensor:
    """(N,) BM25 of row i's query against row i's ad."""
    logging.getLogger("bm25s").setLevel(logging.WARNING)  # its DEBUG lines reached stdout
    docs = list(dict.fromkeys(ads))
    doc_id = {d: i for i, d in enumerate(docs)}
    bm25 = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    bm25.index([words(d) for d in docs], show_progress=False)
    vocab = bm25.vocab_dict
    rows_of: dict[str, list[int]] = {}
    for i, q in enumerate(queries):
        rows_of.setdefault(q, []).append(i)
    out = np.zeros(len(queries), dtype=np.float32)
    for q, rows in rows_of.items():
        known = [w for w in words(q) if w in vocab]  # a word no ad has scores 0
        if known:
            out[rows] = bm25.get_scores(known)[[doc_id[ads[i]] for i in rows]]
    return torch.from_numpy(out)


def zero_shot_scores(
    pretrained: str, queries: list[str], ads: list[str], max_seq_length: int, batch_size: int = 64
) -> torch.Tensor:
    """(N,) cosine of the mean-pooled embeddings of row i's query and ad, each encoded alone:
    the bi-encoder head on the pretrained encoder, untrained (rows truncated as a pair)."""
    model, tok = load_bi_encoder(pretrained, max_seq_length)
    return cosines(model, tok, list(zip(queries, ads, strict=True)), batch_size)


def score_metrics(task: AdRelevance, table: dict, score: torch.Tensor) -> dict[str, float]:
    """The task's threshold-free metrics of any per-row score (only its order matters): min-max
    scaled to [0, 1] first, where AUROC reads it as it is (no sigmoid, no saturation)."""
    lo, hi = score.min(), score.max()
    score = (score - lo) / (hi - lo) if hi > lo else torch.zeros_like(score)
    metrics = {k: m for k, m in task.metrics().items() if k in THRESHOLD_FREE}
    groups = {g: i for i, g in enumerate(dict.fromkeys(table["group"]))}
    group = torch.tensor([groups[g] for g in table["group"]])
    task.update_scores(metrics, score, torch.tensor(table["target"]), group)
    return {f"test/{k}": v for k, v in task.compute(metrics).items()}


def ad_relevance_baselines(
    task: AdRelevance, test: dict, pretrained: str | None, max_seq_length: int
) -> dict[str, dict[str, float]]:
    """{baseline: {test/metric: value}} on the test table; no zero-shot without a pretrained
    encoder (random weights rank nothing)."""
    out = {"bm25": score_metrics(task, test, bm25_scores(test["text"], test["pair"]))}
    if pretrained:
        cos = zero_shot_scores(pretrained, test["text"], test["pair"], max_seq_length)
        out["zero_shot"] = score_metrics(task, test, cos)
    return out


def summary(results: dict) -> str:
    """A table of the fine-tuned model's test metrics beside the baselines'."""
    rows = {"fine-tuned": results["test"], **results.get("baselines", {})}
    names = [k for k in (f"test/{m}" for m in THRESHOLD_FREE) if k in results["test"]]
    lines = [
        f"{'test (' + str(results['rows']['test']) + ' rows)':<22}"
        + "".join(f"{n[5:]:>10}" for n in names)
    ]
    for who, m in rows.items():
        lines.append(f"{who:<22}" + "".join(f"{m.get(n, float('nan')):>10.4f}" for n in names))
    return "\n".join(lines)
