"""`bert-lightning serve` on LitServe: one `LitAPI` per endpoint (`/score`, `/embed`,
`/fill-mask`, and `/rank` of a bi-encoder's catalogue index), each in a worker process of its own
with the model (and index) loaded once, and requests of concurrent clients batched into one
forward pass (`max_batch_size`, `batch_timeout`).

SIGTERM or SIGINT to the server's process drains it: new requests and `/health` answer 503,
requests in flight get their answers (for at most `grace` seconds), then every process of the
server ends and the command exits 0. The HTTP process and the workers leave a signal sent to
the whole group (Ctrl-C in a terminal, systemd) to the server's process, which orchestrates.

A request is checked in the HTTP process against its pydantic model, before it can join a
batch: LitServe fails every request of a batch when one raises, so what only the model can
check (a `[MASK]` that the tokenizer finds, a pooling the model has layers for) is answered per
request as a 4xx `Reply`, never raised. Every error is one line, `{"error": "..."}`."""

# no `from __future__ import annotations`: LitServe hands decode_request's annotation to
# FastAPI as the endpoint's body model, and a string annotation would not resolve there
import _thread
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Self

import litserve as ls
import torch
from fastapi import Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)
from starlette.exceptions import HTTPException
from tokenizers import Encoding

from bert_lightning.catalogue import check_encoder, head_scores, ranked, read_index, text_vectors
from bert_lightning.checkpoint import FINETUNING, HUGGING_FACE, read_checkpoint
from bert_lightning.errors import UserError
from bert_lightning.inference import (
    check_mlm_head,
    embed_texts,
    fill_masks,
    load_embedder,
    load_finetuned,
    load_mlm,
    score_rows,
    split,
    unmaskable,
    zero_shot_bi_encoder,
)
from bert_lightning.model.heads import POOLINGS
from bert_lightning.ort import is_exported, spec_of
from bert_lightning.private_api import shutdown_event
from bert_lightning.tasks.kinds import stored_task

MAX_ITEMS = 256  # texts or pairs per request: a bigger job is a file for `bert-lightning score`
MAX_CHARS = 10_000  # per text: far past what 512 word pieces read; bounds tokenizing time
MAX_TOP_K = 100  # answers per [MASK] of /fill-mask
# /fill-mask answers one {token, prob} per [MASK] and top_k: unbounded, 256 texts of [MASK]s at
# top_k 100 made a 145 MB answer in 9.8 s and a worker of 2.3 GB
MAX_TEXT_MASKS = 16  # per text: a forward pass (32 rows, `inference.EMBED_BATCH`) then holds
# at most 512 masks' logits (62 MB at BERT's 30,522 tokens), whatever requests share it
MAX_ANSWERS = 4096  # masks x top_k per request: about 190 KB of JSON
LIMITS = {  # what /info tells clients
    "items": MAX_ITEMS,
    "chars": MAX_CHARS,
    "top_k": MAX_TOP_K,
    "text_masks": MAX_TEXT_MASKS,
    "answers": MAX_ANSWERS,
}
# glibc's malloc, for the workers (spawned, so they read it as they start): freed blocks of a
# batch's tensors (every batch a new shape) go back to the system, not into per-thread arenas
# and a heap that its dynamic mmap threshold grows into; a user's own setting wins
MALLOC = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}
MAX_BODY = 32 * 2**20  # bytes: MAX_ITEMS pairs of MAX_CHARS, JSON-escaped, fit


def _not_blank(text: str) -> str:
    if not text.strip():
        raise ValueError("a blank text")
    return text


Text = Annotated[str, StringConstraints(max_length=MAX_CHARS)]
NonBlank = Annotated[Text, AfterValidator(_not_blank)]


def mask_count(text: str) -> int:
    """The literal `[MASK]`s: a first bound, in the HTTP process before a request joins a batch.
    What the tokenizer matches is counted in the worker (`mask_refusal`)."""
    return text.count("[MASK]")


def too_many_in_text(n: int) -> str | None:
    return f"{n} [MASK]s; a text may hold at most {MAX_TEXT_MASKS}" if n > MAX_TEXT_MASKS else None


def too_many_answers(n: int, top_k: int) -> str | None:
    if n * top_k <= MAX_ANSWERS:
        return None
    return (
        f"{n} [MASK]s x top_k {top_k} = {n * top_k} answers; a request may ask for at most "
        f"{MAX_ANSWERS} (fewer texts or a smaller top_k)"
    )


def mask_refusal(encodings: list[Encoding], mask_id: int, top_k: int) -> str | None:
    """The 422 reason, as the HTTP process words it, of a request whose texts encode to
    `encodings` past a cap, counting the masks the tokenizer found: a tokenizer decides what
    matches `[MASK]` (one marked `normalized` matched `[mask]`, and 16 texts of one `[MASK]` and
    500 `[mask]`s made 801,600 answers)."""
    counts = [e.ids.count(mask_id) for e in encodings]
    for i, n in enumerate(counts):
        if why := too_many_in_text(n):
            return f"texts.{i}: Value error, {why}"
    if why := too_many_answers(sum(counts), top_k):
        return f"body: Value error, {why}"
    return None


def _few_masks(text: str) -> str:
    if why := too_many_in_text(mask_count(text)):
        raise ValueError(why)
    return text


Masked = Annotated[Text, AfterValidator(_few_masks)]


class Body(BaseModel):
    # strict: a number is not a text; forbid: a misspelt key is not silently ignored
    model_config = ConfigDict(extra="forbid", strict=True)


class Pair(Body):
    query: NonBlank
    ad: NonBlank


class PairsRequest(Body):
    pairs: Annotated[list[Pair], Field(min_length=1, max_length=MAX_ITEMS)]


class TextsRequest(Body):
    texts: Annotated[list[NonBlank], Field(min_length=1, max_length=MAX_ITEMS)]


class EmbedRequest(Body):
    texts: Annotated[list[NonBlank], Field(min_length=1, max_length=MAX_ITEMS)]
    pooling: Literal[tuple(POOLINGS)] | None = Field(
        None,
        description="none: the model's (an ONNX export's or a sentence-transformers folder's "
        "own), `inference.pooling_of`",
    )


class RankRequest(Body):
    query: NonBlank
    k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] | None = Field(
        None, description="the top k ads of the catalogue, best first"
    )
    ids: Annotated[list[Text], Field(min_length=1, max_length=MAX_ITEMS)] | None = Field(
        None, description="these ads' scores, in this order"
    )

    @model_validator(mode="after")
    def _k_or_ids(self) -> Self:
        if (self.k is None) == (self.ids is None):
            raise ValueError("give k (the top k ads of the catalogue) or ids (their scores)")
        return self


class FillMaskRequest(Body):
    texts: Annotated[list[Masked], Field(min_length=1, max_length=MAX_ITEMS)]
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = 5

    @model_validator(mode="after")
    def _few_answers(self) -> Self:
        if why := too_many_answers(sum(map(mask_count, self.texts)), self.top_k):
            raise ValueError(why)
        return self


@dataclass
class Reply:
    """One request's answer; `batch`: the requests answered by the same forward passes."""

    body: dict
    status: int = 200
    batch: int = 1


class Endpoint(ls.LitAPI):
    """One endpoint over one checkpoint. `answer` takes every request of a batch and returns
    one `Reply` each; LitServe calls `predict` with a list of requests when batching
    (max_batch_size > 1), with one request otherwise."""

    route = ""

    def __init__(
        self,
        model: str,
        max_batch_size: int,
        batch_timeout: float,
        threads: int,
        state=None,
        index: str | None = None,
    ):
        super().__init__(
            max_batch_size=max_batch_size, batch_timeout=batch_timeout, api_path=self.route
        )
        self.model_path, self.threads, self.index_path = model, threads, index
        self.state = state if state is not None else mp.RawValue("i", SERVING)

    def setup(self, device):
        """In the worker's process: the stop signals are the server process's to act on; a
        SIGTERM ends the worker only once the server has drained (LitServe's shutdown sends
        it then), so one sent to the whole group leaves the requests in flight answered."""
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, self._on_sigterm)
        torch.set_num_threads(self.threads)
        self.load(device)

    def _on_sigterm(self, signum, frame) -> None:
        if self.state.value == STOPPED:
            os._exit(0)

    def load(self, device) -> None:
        raise NotImplementedError

    def answer(self, requests: list) -> list[Reply]:
        raise NotImplementedError

    def predict(self, x):
        if self.max_batch_size == 1:
            return self.answer([x])[0]
        replies = self.answer(x)
        for r in replies:
            r.batch = len(x)
        return replies

    def encode_response(self, output: Reply):
        return JSONResponse(output.body, output.status, {"X-Batch-Size": str(output.batch)})


class Score(Endpoint):
    """`/score`: one score per row, as `bert-lightning score` gives it, with the checkpoint's
    tokenizer truncating to the length it was fine-tuned with (built once here)."""

    route = "/score"

    def load(self, device):
        self.finetuned = load_finetuned(self.model_path, "bert-lightning serve")
        self.finetuned.model.to(device)
        self.tok = self.finetuned.tokenizer()

    def answer(self, requests: list[list]) -> list[Reply]:
        rows = [row for r in requests for row in r]  # texts, or (query, ad) pairs
        scores = score_rows(self.finetuned.model, self.finetuned.task, self.tok, rows)
        return [Reply({"scores": s}) for s in split(scores, map(len, requests))]


class ScorePairs(Score):
    """`/score` of a pair task: `{"pairs": [{"query": ..., "ad": ...}]}`."""

    def decode_request(self, request: PairsRequest) -> list[tuple[str, str]]:
        return [(p.query, p.ad) for p in request.pairs]


class ScoreTexts(Score):
    """`/score` of a sentence task: `{"texts": [...]}`."""

    def decode_request(self, request: TextsRequest) -> list[str]:
        return request.texts


class Embed(Endpoint):
    """`/embed`: one vector per text, as `bert-lightning embed` pools it."""

    route = "/embed"

    def load(self, device):
        model, self.tok = load_embedder(self.model_path)
        self.model = model.to(device)

    def decode_request(self, request: EmbedRequest) -> EmbedRequest:
        return request

    def answer(self, requests: list[EmbedRequest]) -> list[Reply]:
        """Requests of one pooling share forward passes (a batch rarely mixes them)."""
        replies: dict[int, Reply] = {}
        for pooling in dict.fromkeys(r.pooling for r in requests):
            group = [i for i, r in enumerate(requests) if r.pooling == pooling]
            texts = [requests[i].texts for i in group]
            try:
                flat = [t for ts in texts for t in ts]
                vectors = embed_texts(self.model, self.tok, flat, pooling).tolist()
            except UserError as e:  # last4 on fewer than 4 layers; not the model's own pooling
                replies |= {i: Reply({"error": str(e)}, 400) for i in group}
                continue
            for i, v in zip(group, split(vectors, map(len, texts)), strict=True):
                replies[i] = Reply({"embeddings": v})
        return [replies[i] for i in range(len(requests))]


class FillMask(Endpoint):
    """`/fill-mask`: for each text, for each `[MASK]` in order, the `top_k` {token, prob}, as
    `bert-lightning fill-mask` gives them; each text only as many as its own request asked."""

    route = "/fill-mask"

    def load(self, device):
        model, self.tok = load_mlm(self.model_path)
        self.model = model.to(device)

    def decode_request(self, request: FillMaskRequest) -> FillMaskRequest:
        return request

    def encode(self, request: FillMaskRequest) -> tuple[list[Encoding], Reply | None]:
        """The request's texts encoded one at a time up to the first the model cannot read
        (`unmaskable`, a 400): 10,000 characters can be 10,000 word pieces, about 170 bytes
        each, so a batch holds one such text at a time, not every one (256 of them made 300 MB);
        then its masks as encoded, counted against the caps (`mask_refusal`, a 422)."""
        out = []
        for text in request.texts:
            out.append(self.tok.encode(text))
            if why := unmaskable(self.model, self.tok, [text], out[-1:]):
                return [], Reply({"error": why}, 400)
        if why := mask_refusal(out, self.tok.token_to_id("[MASK]"), request.top_k):
            return [], Reply({"error": why}, 422)
        return out, None

    def answer(self, requests: list[FillMaskRequest]) -> list[Reply]:
        encoded, errors = zip(*map(self.encode, requests), strict=True)
        good = [i for i, e in enumerate(errors) if e is None]
        ks = [requests[i].top_k for i in good for _ in encoded[i]]  # each text its request's
        tops = fill_masks(self.model, self.tok, [e for i in good for e in encoded[i]], ks)
        per_request = dict(zip(good, split(tops, (len(encoded[i]) for i in good)), strict=True))
        return [e or Reply({"masks": per_request[i]}) for i, e in enumerate(errors)]


class Rank(Endpoint):
    """`/rank` of a bi-encoder with the index of a catalogue (`bert-lightning index`): a
    request's query is encoded (one forward pass for the batch's queries), the ads come from the
    index; `k` answers the catalogue's top k ads, `ids` those ads' scores, each as `score
    --index` and pair scoring give it."""

    route = "/rank"

    def load(self, device):
        self.finetuned = load_finetuned(self.model_path, "bert-lightning serve")
        self.finetuned.model.to(device)
        self.tok = self.finetuned.tokenizer()
        self.index = read_index(self.index_path)
        self.searcher = self.index.searcher  # FAISS's, built before the first request
        self.vectors = torch.from_numpy(self.index.vectors)  # (N, H), on the CPU
        self.rows = {i: n for n, i in enumerate(self.index.ids)}

    def decode_request(self, request: RankRequest) -> RankRequest:
        return request

    def answer(self, requests: list[RankRequest]) -> list[Reply]:
        queries = text_vectors(self.finetuned.model, self.tok, [r.query for r in requests])
        n, replies = len(self.index.ids), {}
        top = [i for i, r in enumerate(requests) if r.ids is None and r.k <= n]
        if top:  # one search for the batch, at its largest k
            k = max(requests[i].k for i in top)
            best, rows = ranked(self.finetuned, self.index, queries[top], k)  # (R, k) each
            for i, b, r in zip(top, best.tolist(), rows.tolist(), strict=True):
                k = requests[i].k
                ads = [{"id": self.index.ids[j], "ad": self.index.ads[j], "score": s}
                       for j, s in zip(r[:k], b[:k], strict=True)]  # fmt: skip
                replies[i] = Reply({"ads": ads})
        for i, r in enumerate(requests):
            if i in replies:
                continue
            if r.ids is None:
                replies[i] = Reply({"error": f"k {r.k}: the index holds {n} ads"}, 400)
            elif unknown := [j for j in r.ids if j not in self.rows]:
                replies[i] = Reply({"error": f"ids {unknown[:5]}: not in the index"}, 400)
            else:
                ads = self.vectors[[self.rows[j] for j in r.ids]]  # (len(ids), H)
                cos = (queries[i] * ads).sum(-1)  # (len(ids),), as `ranked` computes it
                replies[i] = Reply({"scores": head_scores(self.finetuned, cos).tolist()})
        return [replies[i] for i in range(len(requests))]


SERVING, DRAINING, STOPPED = 0, 1, 2  # the server's state, shared by its processes
QUIET = 1.0  # seconds with nothing in flight that end a drain


class Drain:
    """The server's state in shared memory (its HTTP process and workers are forked or spawned
    from the server's process and see the same value) and the requests in flight. `gate` is
    the HTTP process's middleware: while draining it refuses new requests and `/health` with
    503; `stop` is the server process's handler of SIGTERM and SIGINT: a first signal drains
    (then `shutdown()`), a second shuts down at once."""

    def __init__(self, grace: float):
        self.grace = grace
        self.state = mp.RawValue("i", SERVING)
        self.in_flight = mp.RawValue("i", 0)  # counted by the one HTTP process's event loop
        self.pid = os.getpid()
        self.shutdown: Callable[[], None] = lambda: None

    async def gate(self, request: Request, call_next):
        if self.state.value != SERVING:
            if request.url.path == "/health":
                return PlainTextResponse("not ready: stopping", 503)
            message = {"error": "the server is stopping: send the request to another one"}
            return JSONResponse(message, 503, {"Connection": "close"})
        self.in_flight.value += 1
        try:
            return await call_next(request)
        finally:
            self.in_flight.value -= 1

    def stop(self, signum, frame) -> None:
        if os.getpid() != self.pid:  # a forked process before it set its own handlers
            return
        if self.state.value == SERVING:
            self.state.value = DRAINING
            said = f"{signal.Signals(signum).name}: draining (up to {self.grace:g} s for the "
            os.write(1, f"{said}requests in flight), then stopping\n".encode())  # no print here
            threading.Thread(target=self._drain, daemon=True).start()
        else:  # in a thread too: the main thread may be inside a call to LitServe's manager
            threading.Thread(target=self._stopped, daemon=True).start()

    def _drain(self) -> None:
        """Until nothing has been in flight for `QUIET` seconds (clients that were just
        answered get a 503 for their next request, rather than a port that closes under it),
        or the grace period is over."""
        deadline, quiet_since = time.monotonic() + self.grace, None
        while (now := time.monotonic()) < deadline:
            if self.in_flight.value:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= QUIET:
                break
            time.sleep(0.05)
        self._stopped()

    def _stopped(self) -> None:
        if self.state.value != STOPPED:
            self.state.value = STOPPED
            self.shutdown()

    def monitor_filter(self, record: logging.LogRecord) -> bool:
        """LitServe's worker monitor polls the shutdown event through its manager every 2 s
        and logs a traceback when the manager has already shut down under it: once stopped,
        that is the server ending, not a crash."""
        return not (self.state.value == STOPPED and record.msg == "Monitoring worker crashed")


def model_name(model: str) -> str:
    """What the server says of its model to clients: the file's or folder's name, not where it
    lies on the server's disk."""
    return Path(model).resolve().name


def endpoints(model: str, index: str | None = None) -> dict[str, type[Endpoint] | str]:
    """For each route, what serves it for this checkpoint (or exported ONNX folder), or why
    none can (a 404's message, naming the model by `model_name`). Read here once, so that a bad
    path, or an index of another encoder, is a one-line error before any worker starts."""
    name = model_name(model)
    rank: type[Endpoint] | str = (
        f"{name}: served without --index; /rank ranks the ads of a catalogue's index "
        "(bert-lightning index)"
    )
    if index is not None:
        check_encoder(read_index(index), load_finetuned(model, "serve --index"), model)
        rank = Rank
    if is_exported(model):
        spec = spec_of(model)
        fine_tuned = spec["use"] == "finetuned"
        task = stored_task(spec["task"], model) if fine_tuned else None
        routes: dict[str, type[Endpoint] | str] = {
            "/score": f"{name}: an exported embedding model; /score needs an exported "
            "fine-tuned one",
            "/embed": f"{name}: an exported fine-tuned model; /embed needs an exported "
            "embedding model"
            if fine_tuned
            else Embed,
            "/fill-mask": f"{name}: an exported ONNX model; /fill-mask needs a checkpoint with "
            "an MLM head",
        }
    else:
        pre = read_checkpoint(model)
        task = stored_task(pre.hparams["task"], model) if pre.origin == FINETUNING else None
        if pre.origin == HUGGING_FACE and (start := zero_shot_bi_encoder(model, pre)):
            task = start.task  # a sentence-transformers folder: its zero-shot score
        routes = {
            "/score": f"{name}: a {pre.origin} checkpoint; /score needs a fine-tuned one "
            "(finetune.py) or a sentence-transformers folder",
            "/embed": Embed,
            "/fill-mask": FillMask,
        }
        try:
            check_mlm_head(name, pre, "/fill-mask")
        except UserError as e:
            routes["/fill-mask"] = str(e)
    if task is not None:
        try:
            task.scores(torch.zeros(1, task.num_labels))
            routes["/score"] = ScorePairs if task.text_columns[1] else ScoreTexts
        except UserError as e:  # token classification, more than two classes
            routes["/score"] = f"{name}: {e}; /score has nothing to give"
    return routes | {"/rank": rank}


def error_line(errors: list[dict], content_type: str) -> str:
    """pydantic's complaints as `where: what; ...` (`pairs.3.ad: Field required`), the first
    three of them."""
    if not content_type.startswith("application/json"):
        return f"expected a JSON body (Content-Type: application/json), got {content_type!r}"
    if errors[0]["type"] == "json_invalid":
        return f"the body is not JSON: {errors[0].get('ctx', {}).get('error', errors[0]['msg'])}"
    said = [f"{'.'.join(map(str, e['loc'][1:])) or 'body'}: {e['msg']}" for e in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return " ".join(("; ".join(said) + more).split())  # loc[0] is "body"; one line


def refusal(message: str) -> Callable:
    async def refuse() -> JSONResponse:
        return JSONResponse({"error": message}, 404)

    return refuse


async def http_error(_, e: HTTPException) -> JSONResponse:
    """LitServe's and Starlette's own errors (401, 404, 405, 413, 500) in the same one-line form,
    with their headers (`WWW-Authenticate`, `Allow`)."""
    return JSONResponse({"error": str(e.detail)}, e.status_code, e.headers)


async def invalid_request(request: Request, e: RequestValidationError) -> JSONResponse:
    kind = request.headers.get("content-type", "")
    return JSONResponse({"error": error_line(e.errors(), kind)}, 422)


def serve(
    model: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_batch_size: int = 32,
    batch_timeout: float = 0.01,
    device: str = "auto",
    threads: int | None = None,
    grace: float = 20.0,
    index: str | None = None,
) -> None:
    """Blocks until SIGTERM or SIGINT (Ctrl+C), then drains for at most `grace` seconds.
    `device` auto: CUDA when there is one. `threads`: torch's intra-op threads in each worker;
    by default one core fewer than torch would take, left to the HTTP process: a forward pass
    whose threads wait on a busy core runs many times slower (docs/serving.md)."""
    if not 1024 <= port <= 65535:
        raise UserError(f"--port {port}: expected 1024 to 65535")
    if max_batch_size < 1 or batch_timeout < 0 or (threads is not None and threads < 1):
        raise UserError(
            "--max-batch-size and --threads must be at least 1, --batch-timeout at least 0"
        )
    if grace < 0:
        raise UserError(f"--grace {grace:g}: expected at least 0 seconds")
    threads = threads or max(1, torch.get_num_threads() - 1)
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda: torch sees no CUDA device")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    for key, value in MALLOC.items():
        os.environ.setdefault(key, value)
    routes = endpoints(model, index)
    drain = Drain(grace)
    apis = [
        e(model, max_batch_size, batch_timeout, threads, drain.state, index)
        for e in routes.values()
        if not isinstance(e, str)
    ]
    server = ls.LitServer(
        apis,
        accelerator=device,
        devices=1,
        max_payload_size=MAX_BODY,
        model_metadata={
            "model": model_name(model),
            "endpoints": [a.api_path for a in apis],
            "limits": LIMITS,
        },
    )
    for route, why in routes.items():  # behind the API key too, where one is set
        if isinstance(why, str):
            server.app.add_api_route(
                route, refusal(why), methods=["POST"], dependencies=[Depends(server.setup_auth())]
            )
    server.app.add_exception_handler(HTTPException, http_error)
    server.app.add_exception_handler(RequestValidationError, invalid_request)
    server.app.middleware("http")(drain.gate)

    def shutdown() -> None:
        """What LitServe's own /shutdown route does: its run() then ends every process it
        started and returns. Before run() has started any, Ctrl+C's KeyboardInterrupt."""
        event = shutdown_event(server)
        if event is None:
            _thread.interrupt_main()
        else:
            event.set()

    drain.shutdown = shutdown
    logging.getLogger(ls.server.__name__).addFilter(drain.monitor_filter)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, drain.stop)
    served = ", ".join(a.api_path for a in apis)
    print(
        f"serving {served} of {model} on http://{host}:{port} ({device}, torch threads per "
        f"worker: {threads}; batches of up to {max_batch_size} requests, {batch_timeout} s to "
        f"fill); GET /health says when ready; SIGTERM or Ctrl+C drains it (up to {grace:g} s)",
        flush=True,
    )
    server.run(host, port, num_api_servers=1, log_level="warning", generate_client_file=False)
