"""A catalogue's ads encoded once by a fine-tuned bi-encoder (`task.architecture=bi_encoder`), as
sponsored search serves them: a query then costs one encoding and a dot product per ad, and its
score of an ad is the one pair scoring gives, `sigmoid(weight x cos(query, ad) + bias)` (the
bi-encoder's head, read from the model at search time).

An index is a folder: `vectors.npy` (N, H), each ad's vector at unit length; `ads.jsonl`, the
ids and texts in the same order (JSON lines: what a file holds is what it reads into, nothing
compressed); `index.json`, what the vectors depend on (the encoder's fingerprint, pooling,
length, normalisation) and the digests of the other two. Each is checked when read: an index of
another encoder, a file cut short or edited, is refused in one line."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from bert_lightning.atomic import atomic_path
from bert_lightning.choices import SCORE_BATCH
from bert_lightning.errors import MissingFileError, UserError
from bert_lightning.fields import json_file
from bert_lightning.inference import Finetuned, per_row
from bert_lightning.model.heads import BertBiEncoder

INDEX, VECTORS, ADS = "index.json", "vectors.npy", "ads.jsonl"
RECORD = {  # index.json: key -> type
    "encoder": str,
    "pooling": str,
    "max_seq_length": int,
    "normalized": bool,
    "count": int,
    "width": int,
    "vectors_sha256": str,
    "ads_sha256": str,
}


@dataclass(frozen=True)
class Index:
    """A catalogue index as read (`read_index`): `vectors` (N, H) float32 unit rows; `ids` and
    `ads` their ids and texts; `record`, index.json."""

    folder: Path
    vectors: np.ndarray
    ids: list[str]
    ads: list[str]
    record: dict

    def rows_of(self, ids: list[str]) -> list[int]:
        """The rows of `ids`; an id the catalogue lacks is a UserError naming it."""
        where = {i: n for n, i in enumerate(self.ids)}
        if unknown := [i for i in ids if i not in where]:
            raise UserError(f"ids {unknown[:5]}: not in the index {self.folder.name}")
        return [where[i] for i in ids]


def bi_encoder(ft: Finetuned, path) -> BertBiEncoder:
    """The model of a fine-tuned bi-encoder checkpoint (or its sentence-transformers folder):
    what an index encodes ads and queries with."""
    if not isinstance(ft.model, BertBiEncoder):
        raise UserError(
            f"{path}: not a fine-tuned bi-encoder's .ckpt or export-hf folder (an index holds "
            "the vectors a bi-encoder, task.architecture=bi_encoder, scores by, as PyTorch "
            "computes them: not an export-onnx folder's)"
        )
    return ft.model


def encoder_fingerprint(ft: Finetuned, path) -> str:
    """What an ad's vector depends on: the encoder's shape and weights, the tokenizer, the
    pooling and the length texts are cut to; the same for a checkpoint and its export-hf folder.
    The weights are hashed a tensor at a time (no copy of them all)."""
    model = bi_encoder(ft, path)
    h = hashlib.sha256()
    for part in (ft.tokenizer_json, model.pooling, ft.max_seq_length, asdict(model.config)):
        h.update(repr(part).encode())
    for key, value in sorted(model.bert.state_dict().items()):
        h.update(key.encode())
        h.update(value.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


@torch.inference_mode()
def text_vectors(
    model: BertBiEncoder, tok: Tokenizer, texts: list[str], batch_size=SCORE_BATCH, desc=None
) -> torch.Tensor:
    """(N, H) each text encoded alone (`[CLS] text [SEP]`, as the bi-encoder reads each side of a
    pair) and pooled, at unit length, float32 on the CPU. `tok`: `Finetuned.tokenizer()`, built
    once per model (a copy of its vocabulary per call cost a /rank request 100 ms)."""

    def vectors(b: dict) -> torch.Tensor:
        v = model.embed(b["input_ids"], b["attention_mask"]).float()  # (B, H)
        return torch.nn.functional.normalize(v, dim=-1).cpu()  # (B, H)

    out = per_row(vectors, model, tok, tok.encode_batch(texts), batch_size, desc)
    return torch.stack(out) if out else torch.zeros(0, model.config.hidden_size)


def check_catalogue(ids: list[str], ads: list[str], source: str) -> None:
    """One id per ad, none twice, no blank ad: an id names one vector."""
    seen: dict[str, int] = {}
    for row, (i, ad) in enumerate(zip(ids, ads, strict=True), 1):
        if i in seen:
            raise UserError(f"{source}: row {row}: id {i!r} again (first at row {seen[i]})")
        if not ad.strip():
            raise UserError(f"{source}: row {row}: id {i!r} has a blank ad")
        seen[i] = row


def build_index(
    ft: Finetuned, model_path, ids: list[str], ads: list[str], out, batch_size=SCORE_BATCH,
    source="catalogue", progress=False,
) -> Path:  # fmt: skip
    """Encode every ad once and write the index folder `out` (a temporary sibling, then renamed:
    never read half-written)."""
    check_catalogue(ids, ads, source)
    model = bi_encoder(ft, model_path)
    vectors = text_vectors(model, ft.tokenizer(), ads, batch_size, "index" if progress else None)
    record = {
        "encoder": encoder_fingerprint(ft, model_path),
        "pooling": model.pooling,
        "max_seq_length": ft.max_seq_length,
        "normalized": True,
        "count": len(ids),
        "width": int(vectors.shape[1]),
    }
    lines = "".join(
        json.dumps({"id": i, "ad": a}, ensure_ascii=False) + "\n"
        for i, a in zip(ids, ads, strict=True)
    )
    with atomic_path(out, folder=True) as tmp:
        with open(tmp / VECTORS, "wb") as f:
            np.save(f, vectors.numpy())
        (tmp / ADS).write_text(lines, encoding="utf-8")
        for name, key in ((VECTORS, "vectors_sha256"), (ADS, "ads_sha256")):
            record[key] = hashlib.sha256((tmp / name).read_bytes()).hexdigest()
        (tmp / INDEX).write_text(json.dumps(record, indent=2) + "\n")
    return Path(out)


def read_index(folder) -> Index:
    """An index folder, each file read once and checked against index.json's digest: a missing,
    cut or edited file is one line naming it."""
    folder = Path(folder)
    for name in (INDEX, VECTORS, ADS):
        if not (folder / name).is_file():
            raise MissingFileError(
                f"{folder / name}: no such file (an index folder has {INDEX}, {VECTORS} and "
                f"{ADS}: bert-lightning index writes them)"
            )
    record = json_file(folder / INDEX, RECORD)
    if missing := [k for k in RECORD if k not in record]:
        raise UserError(f"{folder / INDEX}: no {', '.join(missing)}")
    raw = {}
    for name, key in ((VECTORS, "vectors_sha256"), (ADS, "ads_sha256")):
        raw[name] = (folder / name).read_bytes()
        if hashlib.sha256(raw[name]).hexdigest() != record[key]:
            raise UserError(
                f"{folder / name}: not the file this index wrote (its digest differs from "
                f"{INDEX}'s: cut short or edited); build the index again"
            )
    vectors = np.load(io.BytesIO(raw[VECTORS]), allow_pickle=False)
    lines = raw[ADS].decode("utf-8").split("\n")[:-1]  # not at U+2028 and kin: JSON keeps them
    rows = [json.loads(line) for line in lines]
    ids, ads = [r["id"] for r in rows], [r["ad"] for r in rows]
    shape = (record["count"], record["width"])
    if vectors.shape != shape or vectors.dtype != np.float32 or len(ids) != shape[0]:
        raise UserError(
            f"{folder}: {VECTORS} holds {vectors.shape} {vectors.dtype}, {ADS} {len(ids)} rows; "
            f"{INDEX} says {shape} float32"
        )
    return Index(folder, vectors, ids, ads, record)


def check_encoder(index: Index, ft: Finetuned, model_path) -> None:
    """An index scores with the encoder that made it, or not at all."""
    if index.record["encoder"] != encoder_fingerprint(ft, model_path):
        raise UserError(
            f"{index.folder}: built by another encoder than {model_path} (its vectors would not "
            f"be this model's); bert-lightning index {model_path} CATALOGUE {index.folder}"
        )


def catalogue_changes(index: Index, ids: list[str], ads: list[str]) -> dict[str, list[str]]:
    """The ids added, removed and edited (another ad text) in a catalogue since `index`."""
    was = dict(zip(index.ids, index.ads, strict=True))
    now = dict(zip(ids, ads, strict=True))
    return {
        "added": [i for i in now if i not in was],
        "removed": [i for i in was if i not in now],
        "edited": [i for i in now if i in was and was[i] != now[i]],
    }


def changes_line(changes: dict[str, list[str]]) -> str | None:
    """One line of `catalogue_changes` (None: unchanged), a few ids of each kind."""
    said = [
        f"{len(v)} {k} ({', '.join(map(repr, v[:3]))}{', ...' if len(v) > 3 else ''})"
        for k, v in changes.items()
        if v
    ]
    return "; ".join(said) or None


def head_scores(ft: Finetuned, cos: torch.Tensor) -> torch.Tensor:
    """The 0-1 scores of cosines (any shape): the bi-encoder's head and its task's score, as
    pair scoring applies them (`BertBiEncoder.score`)."""
    head = ft.model.classifier
    logits = head(cos.reshape(-1, 1).to(head.weight))  # (n, 1), on the head's device
    return ft.task.scores(logits).cpu().reshape(cos.shape)


@torch.inference_mode()
def ad_scores(ft: Finetuned, index: Index, queries: torch.Tensor) -> torch.Tensor:
    """(Q, N) the score of each query vector (Q, H) against every ad of the index."""
    return head_scores(ft, queries @ torch.from_numpy(index.vectors).T)  # (Q, N): unit vectors


@torch.inference_mode()
def indexed_pair_scores(
    ft: Finetuned, index: Index, queries: list[str], ids: list[str], batch_size=SCORE_BATCH
) -> torch.Tensor:
    """(N,) the score of each (query, ad id) row from the index's vectors: each distinct query
    encoded once, each ad not at all."""
    rows = index.rows_of(ids)
    distinct = {q: n for n, q in enumerate(dict.fromkeys(queries))}
    u = text_vectors(ft.model, ft.tokenizer(), list(distinct), batch_size)  # (Q, H)
    u = u[[distinct[q] for q in queries]]  # (N, H)
    v = torch.from_numpy(index.vectors[rows])  # (N, H)
    return head_scores(ft, (u * v).sum(-1))  # (N,)


def top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, k) the best scores of each query and their rows, best first, equal scores by row (at
    the k-th place too: the first rows of that score are kept); all rows where there are fewer
    than k."""
    k = min(k, scores.shape[1])
    kth = torch.topk(scores, k, dim=1).values[:, -1:]  # (Q, 1)
    above, equal = scores > kth, scores == kth  # (Q, N) each
    room = k - above.sum(1, keepdim=True)  # (Q, 1): places left for the k-th score
    keep = above | (equal & (equal.cumsum(1) <= room))  # (Q, N), k a row
    rows = keep.nonzero()[:, 1].reshape(len(scores), k)  # (Q, k), by row
    best = scores.gather(1, rows)  # (Q, k)
    order = torch.argsort(best, dim=1, descending=True, stable=True)
    return best.gather(1, order), rows.gather(1, order)
