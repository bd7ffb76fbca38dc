"""`bert-lightning serve` on tiny checkpoints: /score gives what `bert-lightning score` writes,
/embed what `embed` gives and /fill-mask what `fill-mask` gives, however requests are batched;
concurrent requests share forward passes; a bad request is a one-line 4xx and the server goes
on serving; a bad command line is one line, exit 2."""

import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from bert_lightning.cli import main
from bert_lightning.commands.embed import embed
from bert_lightning.commands.export_hf import export_hf
from bert_lightning.commands.fill_mask import fill_mask
from bert_lightning.serving import (
    MALLOC,
    STOPPED,
    Drain,
    Embed,
    EmbedRequest,
    FillMask,
    FillMaskRequest,
    PairsRequest,
    Rank,
    RankRequest,
    ScorePairs,
    ScoreTexts,
    TextsRequest,
    endpoints,
    error_line,
)
from finetune_fixtures import (
    ad_rows,
    finetuned_ckpt,
    regression_rows,
    relevance_ckpt,
    write_csv,
    write_hf_folder,
    write_our_ckpt,
    write_tokenizer,
)
from helpers import ROOT, group_members, run_in_session, session_ends, subprocess_env

MASKED = ["the [MASK] was [MASK]", "a [MASK] film", "bob [MASK]"]


@pytest.fixture
def tok(tmp_path):
    return write_tokenizer(tmp_path / "tokenizer.json")


@pytest.fixture
def bench(monkeypatch):
    """bench/loadtest.py, whose `server` starts and stops `bert-lightning serve` for these
    tests."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    return importlib.import_module("loadtest")


def environ(pid: int) -> dict[str, str]:
    """The environment a process started with."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(e.split("=", 1) for e in raw.split("\0") if "=" in e)


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def scored(tmp_path, ckpt: Path, rows: list[dict]) -> list[float]:
    """What `bert-lightning score` writes for `rows`."""
    write_csv(tmp_path / "rows.csv", rows)
    main(["score", str(ckpt), str(tmp_path / "rows.csv"), str(tmp_path / "scored.jsonl")])
    return pd.read_json(tmp_path / "scored.jsonl", lines=True)["score"].tolist()


def started(endpoint, model, max_batch_size: int = 8):
    api = endpoint(str(model), max_batch_size, 0.0, 1)
    api.setup("cpu")
    return api


def test_score_gives_what_bert_lightning_score_writes_however_rows_are_batched(tmp_path, tok):
    """Cross- and bi-encoder pairs (the bi-encoder's sentence-transformers export too) and a
    sentence task's texts, in requests of 1, 4 and the rest answered by one `predict` (padded
    together) and one at a time."""
    rows = ad_rows(4)
    texts = regression_rows(9)
    cases = [
        (relevance_ckpt(tmp_path, tok)[0], rows, ScorePairs),
        (finetuned_ckpt(tmp_path / "bi.ckpt", tok, "task=ad_relevance",
                        "task.architecture=bi_encoder"), rows, ScorePairs),
        (finetuned_ckpt(tmp_path / "reg.ckpt", tok, "task=regression", "task.target_mean=2.0",
                   "task.target_std=0.5"), texts, ScoreTexts),
    ]  # fmt: skip
    # the bi-encoder exported as a sentence-transformers folder: its score head read back
    cases.append((Path(export_hf(cases[1][0], str(tmp_path / "st"))), rows, ScorePairs))
    for ckpt, table, kind in cases:
        assert endpoints(str(ckpt))["/score"] is kind
        expected = scored(tmp_path, ckpt, table)
        api = started(kind, ckpt)
        if kind is ScorePairs:
            items = [{"query": r["query"], "ad": r["ad"]} for r in table]
            make = lambda part: PairsRequest(pairs=part)
        else:
            items = [r["text"] for r in table]
            make = lambda part: TextsRequest(texts=part)
        parts = (items[:1], items[1:5], items[5:])
        requests = [api.decode_request(make(part)) for part in parts]
        replies = api.predict(requests)
        assert [r.batch for r in replies] == [3, 3, 3] and {r.status for r in replies} == {200}
        got = [s for r in replies for s in r.body["scores"]]
        assert got == pytest.approx(expected, abs=1e-5)
        one = started(kind, ckpt, max_batch_size=1)  # LitServe hands over one request
        assert one.predict(requests[1]).body["scores"] == pytest.approx(expected[1:5], abs=1e-5)


def test_embed_and_fill_mask_give_what_their_commands_give(tmp_path, tok):
    """Requests of different poolings or top-k share a batch; one the model cannot answer (last4
    of a 2-layer model, no [MASK]) gets its own 400 while the rest of its batch is answered."""
    write_hf_folder(tmp_path / "hf4", tok, layers=4)
    write_hf_folder(tmp_path / "hf2", tok, layers=2)
    texts = ["the film", "a lovely story was the plot of the show", "bob"]
    api = started(Embed, tmp_path / "hf4")
    requests = [EmbedRequest(texts=texts[:2]), EmbedRequest(texts=texts, pooling="last4")]
    requests.append(EmbedRequest(texts=texts[2:], pooling="mean"))
    replies = api.predict([api.decode_request(r) for r in requests])
    for r, reply in zip(requests, replies, strict=True):
        want = embed(tmp_path / "hf4", r.texts, r.pooling)
        np.testing.assert_allclose(np.array(reply.body["embeddings"]), want, atol=1e-5)
    api = started(Embed, tmp_path / "hf2")
    bad, good = api.predict([requests[1], requests[0]])
    assert bad.status == 400 and bad.body == {
        "error": "pooling=last4 needs 4 layers; the model has 2"
    }
    np.testing.assert_allclose(
        good.body["embeddings"], embed(tmp_path / "hf2", texts[:2]), atol=1e-5
    )

    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    api = started(FillMask, tmp_path / "pre.ckpt")
    requests = [FillMaskRequest(texts=MASKED[:2], top_k=2), FillMaskRequest(texts=["no mask"])]
    requests.append(FillMaskRequest(texts=MASKED[2:]))
    first, no_mask, last = api.predict(requests)
    assert first.body["masks"] == approx_masks(fill_mask(tmp_path / "pre.ckpt", MASKED[:2], 2))
    assert last.body["masks"] == approx_masks(fill_mask(tmp_path / "pre.ckpt", MASKED[2:]))
    assert no_mask.status == 400 and no_mask.body == {"error": "no [MASK] in 'no mask'"}

    routes = endpoints(str(tmp_path / "hf2"))  # no MLM head, not fine-tuned
    assert routes["/embed"] is Embed and "no MLM head" in routes["/fill-mask"]
    assert "a Hugging Face checkpoint; /score needs a fine-tuned one" in routes["/score"]


def approx_masks(masks):
    return [
        [[{**e, "prob": pytest.approx(e["prob"], abs=1e-5)} for e in m] for m in t] for t in masks
    ]


def test_without_litserve_serve_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "litserve", None)  # as if not installed
    with pytest.raises(SystemExit) as e:
        main(["serve", "any.ckpt"])
    assert e.value.code == 2
    hint = "error: bert-lightning serve needs litserve: pip install 'bert-lightning[serve]'\n"
    assert capsys.readouterr().err == hint


def test_the_monitors_broken_pipe_after_shutdown_is_dropped_only_once_stopped(caplog):
    """LitServe's worker monitor, polling a shutdown event whose manager is gone, logs a
    traceback: a crash while serving, the server ending once stopped."""
    litserve = pytest.importorskip("litserve")
    monitor = inspect.getsource(litserve.server.LitServer._start_worker_monitoring)
    assert 'logger.exception("Monitoring worker crashed")' in monitor  # what the filter knows
    drain, logger = Drain(grace=0), logging.getLogger("litserve.server")
    logger.addFilter(drain.monitor_filter)
    try:
        for state in (drain.state.value, STOPPED):
            drain.state.value = state
            try:
                raise BrokenPipeError(32, "Broken pipe")
            except BrokenPipeError:
                logger.exception("Monitoring worker crashed")
    finally:
        logger.removeFilter(drain.monitor_filter)
    assert [r.msg for r in caplog.records] == ["Monitoring worker crashed"]  # the first only


@pytest.mark.parametrize(
    "make, args, message",
    [
        (None, [], "nope.ckpt: neither a checkpoint file nor a Hugging Face folder"),
        ("text", [], "not a checkpoint (torch.load could not read it"),
        ("ckpt", ["--port", "80"], "--port 80: expected 1024 to 65535"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(tmp_path, tok, capsys, make, args, message):
    path = tmp_path / "nope.ckpt"
    if make == "text":
        path.write_text("not weights\n")
    elif make == "ckpt":
        write_our_ckpt(path, tok)
    with pytest.raises(SystemExit) as e:
        main(["serve", str(path), *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1
    assert message in err


BAD = [  # (method, route, request keywords, status, what the error says)
    ("post", "/score", {"json": {"texts": ["a"]}}, 422, "pairs: Field required"),
    ("post", "/score", {"json": {"pairs": [{"query": 1, "ad": "b"}]}}, 422, "pairs.0.query"),
    ("post", "/score", {"json": {"pairs": [{"query": "a", "ad": "b"}] * 257}}, 422, "at most 256"),
    ("post", "/score", {"json": {"pairs": [{"query": "a" * 10_001, "ad": "b"}]}}, 422, "10000"),
    ("post", "/score", {"content": b"{not json", "headers": {"content-type": "application/json"}},
     422, "not JSON"),
    ("post", "/score", {"data": {"pairs": "x"}}, 422, "Content-Type: application/json"),
    ("post", "/embed", {"json": {"texts": ["the film", " "]}}, 422,
     "texts.1: Value error, a blank text"),
    ("post", "/score", {"json": {"pairs": [{"query": "", "ad": ""}]}}, 422,
     "pairs.0.query: Value error, a blank text; pairs.0.ad: Value error, a blank text"),
    ("post", "/embed", {"json": {"texts": ["a"], "pooling": "sum"}}, 422, "pooling"),
    ("post", "/fill-mask", {"json": {"texts": ["a [MASK]"]}}, 404, "no MLM head"),
    ("get", "/score", {}, 405, "Method Not Allowed"),
    ("post", "/nothing", {"json": {}}, 404, "Not Found"),
]  # fmt: skip


@pytest.mark.slow
def test_the_server_batches_concurrent_requests_and_survives_bad_ones(tmp_path, tok, bench):
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    rows = ad_rows(6)[:16]
    expected = scored(tmp_path, ckpt, rows)
    texts = ["the film", "a lovely story was the plot of the show", "bob"]
    batching = ["--max-batch-size", "16", "--batch-timeout", "0.1"]
    with bench.server(str(ckpt), tmp_path / "server.log", *batching) as (url, pid):
        http = httpx.Client(base_url=url, timeout=60)
        pairs = [{"query": r["query"], "ad": r["ad"]} for r in rows]
        r = http.post("/score", json={"pairs": pairs})
        assert r.status_code == 200 and r.json()["scores"] == pytest.approx(expected, abs=1e-5)
        # the spawned workers start with the malloc settings (forked processes, LitServe's
        # HTTP process and manager, keep the environment the server started with)
        spawned = [p for p in group_members(pid) if b"spawn_main" in cmdline(p)]
        assert spawned and all(MALLOC.items() <= environ(p).items() for p in spawned)

        start = threading.Barrier(16)

        def one(i: int) -> httpx.Response:
            start.wait()
            return httpx.post(f"{url}/score", json={"pairs": [pairs[i]]}, timeout=60)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(one, range(16)))
        assert all(a.status_code == 200 for a in answers)
        got = [a.json()["scores"][0] for a in answers]
        assert got == pytest.approx(expected, abs=1e-5)
        assert max(int(a.headers["x-batch-size"]) for a in answers) > 1  # shared forward passes

        r = http.post("/embed", json={"texts": texts, "pooling": "mean"})
        np.testing.assert_allclose(r.json()["embeddings"], embed(ckpt, texts, "mean"), atol=1e-5)

        for method, route, kwargs, status, says in BAD:
            r = getattr(http, method)(route, **kwargs)
            assert r.status_code == status, (route, kwargs.keys(), r.text)
            body = r.json()
            assert list(body) == ["error"] and "\n" not in body["error"], body
            assert says in body["error"], body
        assert http.get("/health").text == "ok"
        assert http.post("/score", json={"pairs": pairs[:2]}).json()["scores"] == pytest.approx(
            expected[:2], abs=1e-5
        )


@pytest.mark.slow
def test_the_load_test_runs_both_setups_without_errors(tmp_path, tok):
    """bench/serve.py for a couple of seconds on a tiny checkpoint served by PyTorch, batched
    and one request at a time, and a second encoder (`--vs`) in the same round. (ONNX Runtime's
    int8 backend, `backend_model`, is the soak test's.)"""
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    write_hf_folder(tmp_path / "other", tok, layers=1)
    env = subprocess_env(ROOT / "bench")
    args = ["--model", str(ckpt), "--seconds", "2", "--warmup", "0.5", "--clients", "4"]
    args += ["--backends", "torch", "--vs", f"small={tmp_path / 'other'}"]
    cmd = [sys.executable, str(ROOT / "bench/serve.py"), *args, "--json", str(tmp_path / "b.json")]
    r = run_in_session(cmd, env, 600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "| batched, torch | 4 | 32 | 0.01 |" in r.stdout
    assert "| one at a time, torch | 1 | 1 | 0.0 |" in r.stdout
    summary = json.loads((tmp_path / "b.json").read_text())
    rows = summary["rows"]
    assert [row["setup"] for row in rows] == [
        "batched, torch", "batched, torch, small", "one at a time, torch"
    ]  # fmt: skip
    assert [(row["errors"], row["requests"] > 0) for row in rows] == [(0, True)] * 3
    assert rows[2]["mean_batch"] == 1 and rows[0]["rss_after_mib"] > 0
    rate = [row["requests_per_s"] for row in rows]
    ratio = round(rate[1] / rate[0], 2)  # one round: its own ratio
    assert summary["requests_per_s_vs_torch"] == {"torch": 1.0, "torch, small": ratio}
    assert summary["requests_per_s_vs_model"] == {"torch, small": ratio}
    assert summary["speedup"] == round(rate[0] / rate[2], 2)


@pytest.mark.slow
def test_sigterm_drains_the_server_and_ends_every_process_of_it(tmp_path, tok, bench):
    """Under load, one SIGTERM: requests in flight are answered, later ones refused cleanly
    (503, or a closed port), /health says not ready while draining; every process of the
    server is gone within the grace period plus a few seconds, it exits 0, and a new server
    binds the same port."""
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    pair = {"query": "the film", "ad": "a lovely story"}
    # a batch waits 1.5 s to fill: a request sent just before the signal is still in flight
    options = ["--max-batch-size", "64", "--batch-timeout", "1.5", "--grace", "10"]
    with bench.server(str(ckpt), tmp_path / "server.log", *options) as (url, pid):
        port = int(url.rsplit(":", 1)[1])
        stop, answers = threading.Event(), []

        def client() -> None:
            """Posts until refused, as a client behind a load balancer goes elsewhere then."""
            while not stop.is_set():
                try:
                    r = httpx.post(f"{url}/score", json={"pairs": [pair]}, timeout=30)
                    answers.append((r.status_code, r.json()))
                    if r.status_code != 200:
                        return
                except httpx.ConnectError:  # the port is closed: refused before any work
                    answers.append(("refused", None))
                    return
                except httpx.HTTPError as e:  # cut off in flight: what must not happen
                    answers.append((repr(e), None))
                    return

        pool = ThreadPoolExecutor(8)
        try:
            for _ in range(8):
                pool.submit(client)
            t = time.monotonic()  # served once each (on a busy machine, seconds): steady state
            while len(answers) < 8 and time.monotonic() < t + 60:
                time.sleep(0.05)
            # the clients' next requests wait in the batch (1.5 s to fill); on a busy machine a
            # client thread takes a few tenths of a second to send its next
            time.sleep(0.8)
            before = len(answers)
            os.kill(pid, signal.SIGTERM)
            time.sleep(0.3)
            health = httpx.get(f"{url}/health", timeout=5)
            t, done = time.monotonic(), 0
            while not done and time.monotonic() < t + 10 + 15:
                done, status = os.waitpid(pid, os.WNOHANG)
                time.sleep(0.1)
        finally:
            stop.set()
            pool.shutdown()
        assert (health.status_code, health.text) == (503, "not ready: stopping")
        assert done, "the server did not exit within the grace period and 15 s"
        assert os.waitstatus_to_exitcode(status) == 0
        assert session_ends(pid, seconds=5), "a process of the server outlived it"
    served = [body for status, body in answers[before:] if status == 200]  # those in flight
    assert served and all(len(b["scores"]) == 1 for b in served), answers
    refused = [(s, b) for s, b in answers if s != 200]
    assert all(s == "refused" or (s == 503 and "stopping" in b["error"]) for s, b in refused), (
        refused
    )
    log = (tmp_path / "server.log").read_text()
    assert "SIGTERM: draining (up to 10 s for the requests in flight), then stopping" in log
    assert "Traceback" not in log
    with bench.server(str(ckpt), tmp_path / "again.log", port=port) as (again, _):
        assert httpx.get(f"{again}/health", timeout=5).text == "ok"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torch", "int8"])
def test_the_soak_test_counts_bad_requests_as_refusals_not_errors(tmp_path, tok, backend):
    """bench/serve_soak.py for two short 'minutes' on a tiny checkpoint: every bad body is a
    4xx, every good one a score, and each minute has every server process's RSS, whose growth
    counts from the end of the warm-up."""
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    env = subprocess_env(ROOT / "bench")
    args = ["--model", str(ckpt), "--minutes", "2", "--seconds-per-minute", "1.5"]
    args += ["--clients", "4", "--bad-share", "0.5", "--json", str(tmp_path / "soak.json")]
    args += ["--backend", backend, "--warmup-minutes", "1"]
    r = run_in_session([sys.executable, str(ROOT / "bench/serve_soak.py"), *args], env, 600)
    assert r.returncode == 0, r.stderr[-3000:]
    soak = json.loads((tmp_path / "soak.json").read_text())
    assert soak["errors"] == 0 and [row["minute"] for row in soak["rows"]] == [1, 2]
    assert all(row["good"] > 0 and row["bad"] > 0 for row in soak["rows"])
    assert all(row["error_kinds"] == {} for row in soak["rows"])
    assert len(soak["rows"][0]["rss_mib"]) >= 3  # the server, its HTTP process, a worker
    first, last = (row["rss_mib"] for row in soak["rows"])
    for pid, (mib, percent) in soak["rss_growth_after_warmup_mib_and_percent"].items():
        assert mib == round(last[pid] - first[pid], 1)
        assert percent == round(100 * (last[pid] / first[pid] - 1), 2)
    assert soak["backend"] == backend


def indexed(tmp_path, tok) -> tuple[Path, Path, dict[str, str]]:
    """(a bi-encoder checkpoint, its index of ad_rows' ads, their ids by ad)."""
    ckpt = finetuned_ckpt(
        tmp_path / "bi.ckpt", tok, "task=ad_relevance", "task.architecture=bi_encoder"
    )
    ads = sorted({r["ad"] for r in ad_rows(6)})
    ids = {ad: f"ad{n}" for n, ad in enumerate(ads)}
    write_csv(tmp_path / "catalogue.csv", [{"id": i, "ad": ad} for ad, i in ids.items()])
    main(["index", str(ckpt), str(tmp_path / "catalogue.csv"), str(tmp_path / "ix")])
    return ckpt, tmp_path / "ix", ids


def test_rank_answers_the_top_k_and_given_ids_as_pair_scoring_does(tmp_path, tok):
    """A batch of /rank requests: `k` gives the catalogue's best ads by the score pair scoring
    gives each (query, ad), best first; `ids` those ads' scores; a request the index cannot
    answer (an unknown id, k past the catalogue) is its own 400."""
    ckpt, ix, ids = indexed(tmp_path, tok)
    ads = list(ids)
    assert endpoints(str(ckpt), str(ix))["/rank"] is Rank
    assert "without --index" in endpoints(str(ckpt))["/rank"]
    api = Rank(str(ckpt), 8, 0.0, 1, index=str(ix))
    api.setup("cpu")
    requests = [
        RankRequest(query="movie 0", k=5),
        RankRequest(query="a lovely film", ids=[ids[ads[3]], ids[ads[0]]]),
        RankRequest(query="movie 0", ids=["ad1", "nope"]),
        RankRequest(query="movie 0", k=len(ads) + 1),
    ]
    replies = api.predict([api.decode_request(r) for r in requests])
    every = scored(tmp_path, ckpt, [{"query": "movie 0", "ad": ad} for ad in ads])
    expected = dict(zip(ads, every, strict=True))
    best = sorted(ads, key=lambda a: -expected[a])[:5]
    got = replies[0].body["ads"]
    assert [g["ad"] for g in got] == best and [g["id"] for g in got] == [ids[a] for a in best]
    assert [g["score"] for g in got] == pytest.approx([expected[a] for a in best], abs=1e-5)
    theirs = scored(tmp_path, ckpt, [{"query": "a lovely film", "ad": ads[i]} for i in (3, 0)])
    assert replies[1].body["scores"] == pytest.approx(theirs, abs=1e-5)
    assert (replies[2].status, replies[2].body) == (
        400,
        {"error": "ids ['nope']: not in the index"},
    )
    assert (replies[3].status, replies[3].body) == (
        400,
        {"error": f"k {len(ads) + 1}: the index holds {len(ads)} ads"},
    )


def test_rank_with_an_onnx_export_ranks_as_its_checkpoint(tmp_path, tok):
    """`serve ONNX_FOLDER --index` of the checkpoint's index: the queries encoded by ONNX
    Runtime (fp32), the same top ads and scores within 1e-5."""
    pytest.importorskip("onnxruntime")
    from bert_lightning.onnx_export import export_onnx

    ckpt, ix, _ = indexed(tmp_path, tok)
    folder = export_onnx(ckpt, tmp_path / "onnx", quantize=None, pooling=None,
                         max_seq_length=None, overwrite=False)  # fmt: skip
    assert endpoints(str(folder), str(ix))["/rank"] is Rank
    replies = []
    for model in (ckpt, folder):
        api = Rank(str(model), 8, 0.0, 1, index=str(ix))
        api.setup("cpu")
        requests = [RankRequest(query="movie 0", k=4), RankRequest(query="a film", ids=["ad2"])]
        replies.append([r.body for r in api.predict(requests)])
    (top, given), (top_onnx, given_onnx) = replies
    assert [a["id"] for a in top_onnx["ads"]] == [a["id"] for a in top["ads"]]
    assert [a["score"] for a in top_onnx["ads"]] == pytest.approx(
        [a["score"] for a in top["ads"]], abs=1e-5
    )
    assert given_onnx["scores"] == pytest.approx(given["scores"], abs=1e-5)


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"query": "a", "k": 2, "ids": ["ad1"]}, "give k (the top k ads of the catalogue) or ids"),
        ({"query": "a"}, "give k (the top k ads of the catalogue) or ids"),
        ({"query": " ", "k": 2}, "query: Value error, a blank text"),
        ({"query": "a", "k": 0}, "k: Input should be greater than or equal to 1"),
        ({"query": "a", "k": 101}, "k: Input should be less than or equal to 100"),
    ],
)
def test_a_bad_rank_request_is_refused_before_it_joins_a_batch(body, says):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        RankRequest(**body)
    errors = [{**x, "loc": ("body", *x["loc"])} for x in e.value.errors()]  # as FastAPI's
    assert says in error_line(errors, "application/json")


def test_serve_refuses_an_index_of_another_encoder_in_one_line(tmp_path, tok, capsys):
    _, ix, _ = indexed(tmp_path, tok)
    other = finetuned_ckpt(
        tmp_path / "other.ckpt", write_tokenizer(tmp_path / "t.json"), "task=ad_relevance",
        "task.architecture=bi_encoder",
    )  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["serve", str(other), "--index", str(ix), "--port", "8123"])
    err = capsys.readouterr().err
    assert (
        err.startswith(f"error: {ix}: built by another encoder than {other}")
        and err.count("\n") == 1
    )


@pytest.mark.slow
def test_rank_over_http_refuses_bad_requests_in_one_line_and_drains_on_sigterm(
    tmp_path, tok, bench
):
    ckpt, ix, ids = indexed(tmp_path, tok)
    with bench.server(str(ckpt), tmp_path / "server.log", "--index", str(ix)) as (url, pid):
        http = httpx.Client(base_url=url, timeout=60)
        top = http.post("/rank", json={"query": "movie 0", "k": 3})
        assert top.status_code == 200 and len(top.json()["ads"]) == 3
        first = top.json()["ads"][0]
        again = http.post("/rank", json={"query": "movie 0", "ids": [first["id"]]}).json()
        assert again["scores"] == pytest.approx([first["score"]], abs=1e-6)
        for body, status, says in [
            ({"query": "movie 0", "ids": ["nope"]}, 400, "ids ['nope']: not in the index"),
            ({"query": "", "k": 3}, 422, "query: Value error, a blank text"),
            ({"query": "a", "k": 500}, 422, "k: Input should be less than or equal to 100"),
            ({"query": "a", "k": len(ids) + 1}, 400, f"the index holds {len(ids)} ads"),
        ]:
            r = http.post("/rank", json=body)
            assert r.status_code == status and list(r.json()) == ["error"], r.text
            assert says in r.json()["error"] and "\n" not in r.json()["error"]
        os.kill(pid, signal.SIGTERM)
        t, done = time.monotonic(), 0
        while not done and time.monotonic() < t + 30:
            done, status = os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        assert done and os.waitstatus_to_exitcode(status) == 0
        assert session_ends(pid, seconds=5), "a process of the server outlived it"
    assert "Traceback" not in (tmp_path / "server.log").read_text()
