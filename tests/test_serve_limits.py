"""What one request may cost `bert-lightning serve`: the largest request each endpoint takes
leaves every process of the server within a stated memory bound and gets a bounded answer, one
just past each bound is a one-line 422, a key in LIT_SERVER_API_KEY is required of every
request, and /info names no path. And fill-mask answers over the tokenizer's ids only, not the
rows a padded vocabulary adds."""

import json
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch
from pydantic import ValidationError
from tokenizers import Tokenizer

from bert_lightning.commands.fill_mask import fill_mask
from bert_lightning.serving import (
    MAX_ANSWERS,
    MAX_CHARS,
    MAX_ITEMS,
    MAX_TEXT_MASKS,
    MAX_TOP_K,
    EmbedRequest,
    FillMask,
    FillMaskRequest,
    TextsRequest,
    error_line,
    mask_refusal,
)
from bert_lightning.weights import padded_vocab
from finetune_fixtures import finetuned_ckpt, write_our_ckpt, write_tokenizer
from helpers import group_members, session_ends, signal_group, subprocess_env

KEY = "a-test-key"
# what a route's largest requests may add to the peak RSS of any process of the server:
# /embed and /score tokenize a text whole before they truncate it (the tokenizer keeps the rest
# as overflow, about 170 bytes a word piece), so 256 texts of 10,000 one-character pieces take
# about 430 MB; /fill-mask holds one text past the model's positions at a time
GROWTH_MIB = {"/fill-mask": 64, "/embed": 512, "/score": 512}
ANSWER_BYTES = 64  # of JSON, per {token, prob} of /fill-mask
DENSE = "." * MAX_CHARS  # as long as a text may be, a word piece a character
FULL = " ".join(["[MASK] the film lovely"] * (MAX_TEXT_MASKS - 1) + ["[MASK] bob"])  # 64 pieces


def masked(n: int) -> str:
    return " ".join(["[MASK]"] * n)


# the largest requests each endpoint takes, and their status. Not /score's pairs: tokenizers'
# pair truncation keeps the cross product of both texts' overflow (huggingface/tokenizers#2035),
# and 256 pairs of 10,000 characters took a worker past 15 GB
LARGEST = {
    "/fill-mask": [  # the most answers: the most masks, the largest top_k; the most pieces
        ({"texts": [FULL] * (MAX_ANSWERS // MAX_TEXT_MASKS), "top_k": 1}, 200),
        ({"texts": [masked(1)] * (MAX_ANSWERS // MAX_TOP_K), "top_k": MAX_TOP_K}, 200),
        ({"texts": [masked(1) + DENSE[6:]] * MAX_ITEMS}, 400),  # past the model's positions
    ],
    "/embed": [({"texts": [DENSE] * MAX_ITEMS, "pooling": "mean"}, 200)],
    "/score": [({"texts": [DENSE] * MAX_ITEMS}, 200)],
}
# a request just past each bound, and what its 422 says
PAST = [
    (TextsRequest, "/score", {"texts": ["a"] * (MAX_ITEMS + 1)},
     "texts: List should have at most 256 items after validation, not 257"),
    (TextsRequest, "/score", {"texts": ["a" * (MAX_CHARS + 1)]},
     "texts.0: String should have at most 10000 characters"),
    (EmbedRequest, "/embed", {"texts": ["a"] * (MAX_ITEMS + 1)},
     "texts: List should have at most 256 items after validation, not 257"),
    (EmbedRequest, "/embed", {"texts": ["a" * (MAX_CHARS + 1)]},
     "texts.0: String should have at most 10000 characters"),
    (FillMaskRequest, "/fill-mask", {"texts": [masked(1)] * (MAX_ITEMS + 1)},
     "texts: List should have at most 256 items after validation, not 257"),
    (FillMaskRequest, "/fill-mask", {"texts": [masked(1) + "a" * MAX_CHARS]},
     "texts.0: String should have at most 10000 characters"),
    (FillMaskRequest, "/fill-mask", {"texts": [masked(1)], "top_k": MAX_TOP_K + 1},
     "top_k: Input should be less than or equal to 100"),
    (FillMaskRequest, "/fill-mask", {"texts": [masked(MAX_TEXT_MASKS + 1)]},
     "texts.0: Value error, 17 [MASK]s; a text may hold at most 16"),
    (FillMaskRequest, "/fill-mask",
     {"texts": [masked(1)] * (MAX_ANSWERS // MAX_TOP_K + 1), "top_k": MAX_TOP_K},
     "body: Value error, 41 [MASK]s x top_k 100 = 4100 answers; a request may ask for at most "
     "4096 (fewer texts or a smaller top_k)"),
]  # fmt: skip


@pytest.fixture
def tok(tmp_path):
    return write_tokenizer(tmp_path / "tokenizer.json")


def test_fill_mask_answers_over_the_tokenizers_ids_only(tmp_path, tok):
    """A vocabulary padded to a multiple of 64, as `data.tokenizer.extend` pads it: its extra
    rows are no token, so they take no probability and are no answer, however large top_k."""
    n = tok.get_vocab_size()
    write_our_ckpt(tmp_path / "pre.ckpt", tok, vocab_size=padded_vocab(n))
    assert padded_vocab(n) > n
    for m in fill_mask(tmp_path / "pre.ckpt", ["the [MASK] was [MASK]"], top_k=n + 20)[0]:
        assert len(m) == n and all(e["token"] is not None for e in m)
        assert sum(e["prob"] for e in m) == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize("route, body", [(r, b) for r, bs in LARGEST.items() for b, _ in bs])
def test_the_largest_requests_are_within_the_bounds(route, body):
    model = {"/score": TextsRequest, "/embed": EmbedRequest, "/fill-mask": FillMaskRequest}
    model[route].model_validate(body)


@pytest.mark.parametrize("model, route, body, says", PAST)
def test_a_request_past_a_bound_is_refused_in_one_line(model, route, body, says):
    with pytest.raises(ValidationError) as e:
        model.model_validate(body)
    errors = [{**x, "loc": ("body", *x["loc"])} for x in e.value.errors()]  # as FastAPI's
    assert error_line(errors, "application/json") == says


def normalized_mask(tok: Tokenizer) -> Tokenizer:
    """`tok` with `[MASK]` marked `normalized`, read unchecked: it also matches `[mask]`."""
    raw = json.loads(tok.to_str())
    next(t for t in raw["added_tokens"] if t["content"] == "[MASK]")["normalized"] = True
    return Tokenizer.from_str(json.dumps(raw))


# texts within the literal count's caps, past them as the tokenizer encodes them, and the 422
BY_ENCODING = [
    (["[MASK] " + "[mask] " * MAX_TEXT_MASKS], 1,
     "texts.0: Value error, 17 [MASK]s; a text may hold at most 16"),
    (["[mask] [MASK]"] * 21, MAX_TOP_K,
     "body: Value error, 42 [MASK]s x top_k 100 = 4200 answers; a request may ask for at most "
     "4096 (fewer texts or a smaller top_k)"),
]  # fmt: skip


@pytest.mark.parametrize("texts, top_k, says", BY_ENCODING)
def test_fill_mask_counts_the_masks_the_tokenizer_finds(tok, texts, top_k, says):
    """A tokenizer decides what matches `[MASK]`: /fill-mask's caps count the mask ids of the
    encodings, before any forward pass (the model here has none to run)."""
    mask = normalized_mask(tok)
    request = FillMaskRequest(texts=texts, top_k=top_k)  # the HTTP process's count passes it
    mask_id = mask.token_to_id("[MASK]")
    encodings = [mask.encode(t) for t in texts]
    assert mask_refusal(encodings, mask_id, top_k) == says
    assert mask_refusal([tok.encode(t) for t in texts], mask_id, top_k) is None
    endpoint = FillMask.__new__(FillMask)
    endpoint.tok, endpoint.model = mask, torch.nn.Module()  # no weights, no forward pass
    endpoint.model.config = SimpleNamespace(max_position_embeddings=512)
    [reply] = endpoint.answer([request])
    assert (reply.status, reply.body) == (422, {"error": says})


def status_mib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak RSS) of a process, in MiB."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: int(v.split()[0]) // 1024 for k, _, v in (x.partition(":") for x in lines)
            if k in ("VmRSS", "VmHWM")}  # fmt: skip


@contextmanager
def keyed_server(model: Path, log: Path):
    """`bert-lightning serve MODEL` with LIT_SERVER_API_KEY set, in a session of its own;
    yields (an httpx client that sends the key, the server's pid) once /health says ok."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "bert_lightning", "serve", str(model), "--port", str(port)]
    env = subprocess_env() | {"LIT_SERVER_API_KEY": KEY}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, "--device", "cpu"], env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    http = httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"X-API-Key": KEY}, timeout=120
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            with suppress(httpx.HTTPError):
                if http.get("/health").text == "ok":
                    break
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        yield http, proc.pid
    finally:
        signal_group(proc.pid, signal.SIGINT)  # drains and stops
        with suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        if not session_ends(proc.pid, 5):
            signal_group(proc.pid, signal.SIGKILL)
        http.close()


@pytest.mark.slow
def test_the_largest_request_of_each_endpoint_is_bounded_in_memory(tmp_path, tok):
    """Each endpoint's largest requests, after one small one (a worker's first forward pass
    allocates what it keeps): their status, none adding more than its GROWTH_MIB to any
    process's peak RSS, /fill-mask's answer at most ANSWER_BYTES an answer; one past each bound
    is a 422; without the key, or with another one, every route is a 401; /info names the model
    by its file's name."""
    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    sentences = finetuned_ckpt(
        tmp_path / "reg.ckpt", tok, "task=regression", "task.target_mean=2.0", "task.target_std=0.5"
    )
    small = {
        "/fill-mask": {"texts": ["a [MASK] film"]},
        "/embed": {"texts": ["a film"], "pooling": "mean"},
        "/score": {"texts": ["a film"]},
    }
    for model, routes in ((tmp_path / "pre.ckpt", ["/fill-mask", "/embed"]),
                          (sentences, ["/score"])):  # fmt: skip
        with keyed_server(model, tmp_path / f"{model.stem}.log") as (http, pid):
            for route in routes:
                assert http.post(route, json=small[route]).status_code == 200
            for route in routes:  # the heaviest last: a peak is counted from the RSS before
                before = {p: status_mib(p)["VmRSS"] for p in group_members(pid)}
                for body, status in LARGEST[route]:
                    r = http.post(route, json=body)
                    assert r.status_code == status, (route, r.text[:300])
                    assert len(r.content) <= MAX_ANSWERS * ANSWER_BYTES or route != "/fill-mask"
                growth = {p: status_mib(p)["VmHWM"] - rss for p, rss in before.items()}
                print(route, "peak RSS growth, MiB, per process:", growth)
                assert max(growth.values()) <= GROWTH_MIB[route], (route, growth)

            for _, route, body, says in (p for p in PAST if p[1] in routes):
                r = http.post(route, json=body)
                assert (r.status_code, r.json()) == (422, {"error": says}), route
            info = http.get("/info")
            assert info.json()["model"]["model"] == model.name and str(tmp_path) not in info.text
            assert info.json()["model"]["limits"]["answers"] == MAX_ANSWERS
            for headers in ({}, {"X-API-Key": "another"}):
                with httpx.Client(base_url=http.base_url, headers=headers, timeout=30) as bare:
                    for method, route in [("get", "/health"), ("get", "/info"),
                                          *(("post", r) for r in small)]:  # fmt: skip
                        kwargs = {"json": small[route]} if method == "post" else {}
                        r = getattr(bare, method)(route, **kwargs)
                        assert r.status_code == 401, (route, r.text)
                        assert list(r.json()) == ["error"] and "\n" not in r.json()["error"]
