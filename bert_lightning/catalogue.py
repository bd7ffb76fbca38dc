"""A catalogue's ads encoded once by a fine-tuned bi-encoder (`task.architecture=bi_encoder`), as
sponsored search serves them: a query then costs one encoding and a dot product per ad, and its
score of an ad is the one pair scoring gives, `sigmoid(weight x cos(query, ad) + bias)` (the
bi-encoder's head, read from the model at search time).

An index is a folder: `vectors.npy` (N, H), each ad's vector at unit length; `ads.jsonl`, the
ids and texts in the same order (JSON lines: what a file holds is what it reads into, nothing
compressed); `index.json`, what the vectors depend on (the encoder's fingerprint, pooling,
length, normalisation), how the index is searched, and the digests of the other two. Each is
checked when read: an index of another encoder, a file cut short or edited, is refused in one
line. Search is FAISS's (the `rank` extra): exact inner product, or (`--hnsw M`) an HNSW graph of
M links per ad, for large catalogues. The graph is built from the vectors where the index is
searched, one thread, so every process builds the same one: a FAISS file is a program's memory
laid out, whose sizes a file made by someone else could set to anything."""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from bert_lightning.atomic import atomic_path
from bert_lightning.choices import EF_SEARCH, SCORE_BATCH
from bert_lightning.errors import MissingFileError, UserError, first_line
from bert_lightning.fields import json_file
from bert_lightning.inference import Finetuned, per_row
from bert_lightning.model.heads import BertBiEncoder
from bert_lightning.ort import OrtBiEncoder

INDEX, VECTORS, ADS = "index.json", "vectors.npy", "ads.jsonl"
RECORD = {  # index.json: key -> type
    "encoder": str,
    "pooling": str,
    "max_seq_length": int,
    "normalized": bool,
    "count": int,
    "width": int,
    "search": str,  # exact | hnsw
    "hnsw_m": int,  # the graph's links per ad (0: exact)
    "ef_search": int,  # the candidates HNSW keeps while it searches, at least k (0: exact)
    "vectors_sha256": str,
    "ads_sha256": str,
}


def faiss():
    """FAISS, which searches an index: in the `rank` extra."""
    try:
        import faiss as module
    except ImportError:
        raise UserError(
            "searching an index needs FAISS: pip install 'bert-lightning[rank]' (faiss-cpu)"
        ) from None
    return module


def search_settings(hnsw_m: int, ef_search: int) -> str | None:
    """Why an index cannot be searched with these settings (None: it can); exact search is
    `hnsw_m` 0 with `ef_search` 0."""
    if (hnsw_m, ef_search) == (0, 0) or (2 <= hnsw_m <= 128 and 1 <= ef_search <= 4096):
        return None
    return (
        f"--hnsw {hnsw_m} --ef-search {ef_search}: expected --hnsw 2 to 128, --ef-search 1 to 4096"
    )


@dataclass(frozen=True)
class Index:
    """A catalogue index as read (`read_index`): `vectors` (N, H) float32 unit rows; `ids` and
    `ads` their ids and texts; `record`, index.json."""

    folder: Path
    vectors: np.ndarray
    ids: list[str]
    ads: list[str]
    record: dict

    @cached_property
    def exact(self):
        """FAISS's exact inner product over the vectors, built here once."""
        flat = faiss().IndexFlatIP(self.vectors.shape[1])
        flat.add(self.vectors)
        return flat

    @cached_property
    def groups(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """The distinct vectors (U, H) and the rows of each, ascending: ads of one text share a
        vector, and HNSW's links reach few of many equal points, so its graph holds each once."""
        distinct, inverse = np.unique(self.vectors, axis=0, return_inverse=True)
        order = np.argsort(inverse.reshape(-1), kind="stable")  # (N,): rows by group
        return distinct, np.split(order, np.cumsum(np.bincount(inverse.reshape(-1)))[:-1])

    @cached_property
    def searcher(self):
        """What the index is searched by, built here once: exact search, or the HNSW graph of the
        distinct vectors (one thread: the same graph in every process)."""
        f, width, m = faiss(), self.vectors.shape[1], self.record["hnsw_m"]
        if not m:
            return self.exact
        graph, threads = f.IndexHNSWFlat(width, m, f.METRIC_INNER_PRODUCT), f.omp_get_max_threads()
        f.omp_set_num_threads(1)
        try:
            graph.add(self.groups[0])
        finally:
            f.omp_set_num_threads(threads)
        return graph

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(Q, k) the largest inner products of each query (Q, H) with the ads and their rows,
        largest first; k from 1 to the catalogue's size. HNSW finds the best k distinct vectors
        (at least k wide), each standing for its rows; a query it finds fewer for is searched
        exactly."""
        queries = np.ascontiguousarray(queries, np.float32)
        if not self.record["hnsw_m"]:
            inner, rows = self.exact.search(queries, k)
        else:
            distinct, members = self.groups
            u = min(k, len(distinct))
            wide = faiss().SearchParametersHNSW(efSearch=max(u, self.record["ef_search"]))
            near, found = self.searcher.search(queries, u, params=wide)  # (Q, u) each
            inner, rows = np.empty((len(queries), k), np.float32), np.empty((len(queries), k), int)
            for q in range(len(queries)):
                if (found[q] < 0).any():
                    inner[q : q + 1], rows[q : q + 1] = self.exact.search(queries[q : q + 1], k)
                    continue
                sizes = [len(members[g]) for g in found[q]]
                rows[q] = np.concatenate([members[g] for g in found[q]])[:k]
                inner[q] = np.repeat(near[q], sizes)[:k]
        if (rows < 0).any():  # a row -1 would name the last ad
            raise RuntimeError("a query's vector is not finite: FAISS found no ads for it")
        return inner, rows

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
            "computes them; an export-onnx folder of it encodes queries against them)"
        )
    return ft.model


def encoder_fingerprint(ft: Finetuned, path) -> str:
    """What an ad's vector depends on: the encoder's shape and weights, the tokenizer, the
    pooling and the length texts are cut to; the same for a checkpoint and its export-hf folder,
    and its export-onnx folder records it (its queries, fp32 or int8, ranked against the
    checkpoint's vectors). The weights are hashed a tensor at a time (no copy of them all)."""
    if isinstance(ft.model, OrtBiEncoder):
        if "encoder" not in ft.model.encoder.spec:
            raise UserError(
                f"{path}: exported without its encoder's fingerprint, which an index checks; "
                "export-onnx the checkpoint again"
            )
        return ft.model.encoder.spec["encoder"]
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
    model: BertBiEncoder | OrtBiEncoder,
    tok: Tokenizer,
    texts: list[str],
    batch_size=SCORE_BATCH,
    desc=None,
) -> torch.Tensor:
    """(N, H) each text encoded alone (`[CLS] text [SEP]`, as the bi-encoder reads each side of a
    pair) and pooled, at unit length, float32 on the CPU. `tok`: `Finetuned.tokenizer()`, built
    once per model (a copy of its vocabulary per call cost a /rank request 100 ms)."""

    def vectors(b: dict) -> torch.Tensor:
        v = model.embed(b["input_ids"], b["attention_mask"]).float()  # (B, H)
        return torch.nn.functional.normalize(v, dim=-1).cpu()  # (B, H)

    out = per_row(vectors, model, tok, tok.encode_batch(texts), batch_size, desc)
    if out:
        return torch.stack(out)
    ort = isinstance(model, OrtBiEncoder)
    return torch.zeros(0, model.encoder.spec["width"] if ort else model.config.hidden_size)


def check_catalogue(ids: list[str], ads: list[str], source: str) -> None:
    """One id per ad, none twice, no blank ad: an id names one vector."""
    seen: dict[str, int] = {}
    for row, (i, ad) in enumerate(zip(ids, ads, strict=True), 1):
        if i in seen:
            raise UserError(f"{source}: row {row}: id {i!r} again (first at row {seen[i]})")
        if not ad.strip():
            raise UserError(f"{source}: row {row}: id {i!r} has a blank ad")
        seen[i] = row


def write_index(
    ft: Finetuned, model_path, ids: list[str], ads: list[str], vectors: torch.Tensor, out,
    hnsw_m=0, ef_search=EF_SEARCH,
) -> Path:  # fmt: skip
    """The index folder `out` of the ads' `vectors` (N, H) as `text_vectors` gives them, of a
    catalogue `check_catalogue` passed (a temporary sibling, then renamed: never read
    half-written). `hnsw_m` > 0: searched by an HNSW graph of that many links per ad,
    `ef_search` wide."""
    ef_search = ef_search if hnsw_m else 0
    if why := search_settings(hnsw_m, ef_search):
        raise UserError(why)
    model = bi_encoder(ft, model_path)
    record = {
        "encoder": encoder_fingerprint(ft, model_path),
        "pooling": model.pooling,
        "max_seq_length": ft.max_seq_length,
        "normalized": True,
        "count": len(ids),
        "width": int(vectors.shape[1]),
        "search": "hnsw" if hnsw_m else "exact",
        "hnsw_m": hnsw_m,
        "ef_search": ef_search,
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
    search = "hnsw" if record["hnsw_m"] else "exact"
    if why := search_settings(record["hnsw_m"], record["ef_search"]) or (
        None if record["search"] == search else f"search {record['search']!r}: expected {search}"
    ):
        raise UserError(f"{folder / INDEX}: {why}")
    raw = {}
    for name, key in ((VECTORS, "vectors_sha256"), (ADS, "ads_sha256")):
        raw[name] = (folder / name).read_bytes()
        if hashlib.sha256(raw[name]).hexdigest() != record[key]:
            raise UserError(
                f"{folder / name}: not the file this index wrote (its digest differs from "
                f"{INDEX}'s: cut short or edited); build the index again"
            )
    shape = (record["count"], record["width"])
    if min(shape) < 1:
        raise UserError(f"{folder / INDEX}: count {shape[0]}, width {shape[1]}: expected >= 1")
    vectors = unit_rows(folder / VECTORS, raw[VECTORS], shape)
    ids, ads = ads_of(folder / ADS, raw[ADS], shape[0])
    return Index(folder, vectors, ids, ads, record)


def unit_rows(path: Path, raw: bytes, shape: tuple[int, int]) -> np.ndarray:
    """`shape` float32 rows of unit length from a .npy file's bytes; its header read first: its
    shape, not the file's length, sizes what np.load allocates."""
    stream = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(stream)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"format version {version}")
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else None
        held, _, dtype = (header or np.lib.format.read_array_header_2_0)(stream)
        if (
            held != shape
            or dtype != np.dtype("<f4")
            or len(raw) != stream.tell() + 4 * held[0] * held[1]
        ):
            raise ValueError(f"{len(raw)} bytes of {held} {dtype}; {INDEX} says {shape} float32")
        vectors = np.load(io.BytesIO(raw), allow_pickle=False)
    except ValueError as e:
        raise UserError(f"{path}: {e}") from None
    norms = np.linalg.norm(vectors, axis=1)  # (N,)
    if not (np.isfinite(norms).all() and np.abs(norms - 1).max() <= 1e-3):
        raise UserError(f"{path}: rows not of unit length (or not finite): not an index's vectors")
    return vectors


def ads_of(path: Path, raw: bytes, count: int) -> tuple[list[str], list[str]]:
    """The ids and ads of ads.jsonl's bytes: `count` lines of `{"id": .., "ad": ..}`, each id
    once, no blank ad (`check_catalogue`)."""
    try:
        lines = raw.decode("utf-8").split("\n")[:-1]  # not at U+2028 and kin: JSON keeps them
        rows = [json.loads(line) for line in lines]
    except ValueError as e:  # bad UTF-8 or JSON
        raise UserError(f"{path}: {first_line(e)}") from None
    if len(rows) != count or not all(
        isinstance(r, dict) and isinstance(r.get("id"), str) and isinstance(r.get("ad"), str)
        for r in rows
    ):
        raise UserError(f'{path}: expected {count} lines of {{"id": .., "ad": ..}}')
    ids, ads = [r["id"] for r in rows], [r["ad"] for r in rows]
    check_catalogue(ids, ads, str(path))
    return ids, ads


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
def ranked(
    ft: Finetuned, index: Index, queries: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(Q, k) the top k ads of each query vector (Q, H) by score, best first, and their rows (all
    rows where the catalogue holds fewer). The head's score, `sigmoid(w cos + b)`, rises with the
    cosine where w > 0 and falls where w < 0: the index searches the largest cosines of the
    query, or of its opposite, and only the k found are scored, as `indexed_pair_scores` scores
    given ids; equal scores in row order (of the ads found: HNSW may find others of the same
    score than exact search)."""
    sign = -1.0 if float(ft.model.classifier.weight) < 0 else 1.0
    _, rows = index.search(sign * queries.numpy(), min(k, len(index.ids)))  # (Q, k)
    rows = torch.from_numpy(rows).sort(dim=1).values  # (Q, k): equal scores then by row
    ads = torch.from_numpy(index.vectors)[rows]  # (Q, k, H)
    scores = head_scores(ft, (queries[:, None, :] * ads).sum(-1))  # (Q, k): as `ids` scores
    order = torch.argsort(scores, dim=1, descending=True, stable=True)
    return scores.gather(1, order), rows.gather(1, order)


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
