"""`bert-lightning download-c4` against a tiny fake hub on 127.0.0.1: the endpoints
huggingface_hub calls (HEAD and ranged GET on /datasets/allenai/c4/resolve/<rev>/en/<file>)."""

import gzip
import hashlib
import json
import random
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from huggingface_hub import constants

from bert_lightning.cli import main
from bert_lightning.commands.download_c4 import parse_shards, shard_name
from bert_lightning.data.corpus import iter_documents
from bert_lightning.errors import UserError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
PREFIX = re.compile(r"/datasets/allenai/c4/resolve/([^/]+)/en/(.+)")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def c4_shard(seed: int) -> bytes:
    """A C4-shaped gzip JSON-lines shard (text, timestamp, url) of some 4 kB."""
    rng = random.Random(seed)
    words = ["the", "film", "story", "rain", "bread", "north", "quiet", "seven", "glass"]
    lines = [
        {
            "text": f"Document {seed}.{i}. " + " ".join(rng.choices(words, k=100)),
            "timestamp": "2019-04-20 14:19:41",
            "url": f"https://example.com/{seed}/{i}",
        }
        for i in range(50)
    ]
    return gzip.compress("".join(json.dumps(r) + "\n" for r in lines).encode(), mtime=0)


class FakeHub(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}  # name -> the bytes served (revision main)
    sha: dict[str, str] = {}  # name -> the sha256 advertised (X-Linked-Etag)
    revisions: dict[str, dict[str, bytes]] = {}  # another revision -> its files
    log: list[tuple[str, str, str | None]] = []  # (method, name, Range)

    def log_message(self, *args):  # keep pytest's output clean
        pass

    def _name(self):
        m = PREFIX.fullmatch(self.path)
        files = (self.files if m[1] == "main" else self.revisions.get(m[1], {})) if m else {}
        if not m or m[2] not in files:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        self.served = files[m[2]]
        return m[2]

    def _headers(self, name: str, status: int, length: int) -> None:
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header(
            "ETag", '"a1b2c3d4e5f6a1b2c3d4e5f6a1b2c3d4e5f6a1b2"'
        )  # git oid of the pointer
        sha = self.sha[name] if self.served is self.files.get(name) else sha256(self.served)
        self.send_header("X-Linked-Etag", f'"{sha}"')  # LFS: the file's sha256
        self.send_header("X-Linked-Size", str(len(self.served)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(length))

    def do_HEAD(self):
        if name := self._name():
            self.log.append(("HEAD", name, None))
            self._headers(name, 200, len(self.served))
            self.end_headers()

    def do_GET(self):
        if not (name := self._name()):
            return
        rng = self.headers.get("Range")
        self.log.append(("GET", name, rng))
        data, start = self.served, 0
        if rng:
            start = int(rng.removeprefix("bytes=").split("-")[0])
        self._headers(name, 206 if rng else 200, len(data) - start)
        if rng:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        self.wfile.write(data[start:])


@pytest.fixture
def hub(monkeypatch):
    files = {shard_name("train", i): c4_shard(i) for i in range(3)}
    files[shard_name("validation", 0)] = c4_shard(100)
    FakeHub.files = files
    FakeHub.sha = {n: sha256(b) for n, b in files.items()}
    FakeHub.revisions, FakeHub.log = {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # conftest's offline default
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield FakeHub
    server.shutdown()
    server.server_close()


def test_shards_arrive_and_a_second_run_downloads_nothing(tmp_path, hub, capsys):
    main(["download-c4", str(tmp_path / "c4"), "--train", "0-1", "--validation", "0"])
    names = [shard_name("train", 0), shard_name("train", 1), shard_name("validation", 0)]
    shown = [p.name for p in (tmp_path / "c4" / "en").iterdir() if not p.name.startswith(".")]
    assert sorted(shown) == sorted(names)
    for name in names:
        assert (tmp_path / "c4" / "en" / name).read_bytes() == hub.files[name]
    assert sorted(n for m, n, _ in hub.log if m == "GET") == sorted(names)
    texts = list(iter_documents([str(tmp_path / "c4" / "en" / names[0])]))
    assert len(texts) == 50 and texts[0].startswith("Document 0.0.")

    hub.log.clear()
    main(["download-c4", str(tmp_path / "c4"), "--train", "0-1", "--validation", "0"])
    assert hub.log == []  # complete files are skipped without asking the hub
    assert capsys.readouterr().out.count(": present") == 3


def test_a_file_present_is_the_revision_asked_for(tmp_path, hub, capsys):
    """A shard is reused only as the revision it was fetched as, or as the same bytes."""
    name, out = shard_name("train", 0), str(tmp_path / "c4")
    dest = tmp_path / "c4" / "en" / name
    main(["download-c4", out, "--train", "0"])
    hub.revisions = {"v2": {name: c4_shard(7)}, "v3": {name: c4_shard(7)}}
    main(["download-c4", out, "--train", "0", "--revision", "v2"])
    assert dest.read_bytes() == c4_shard(7) != hub.files[name]  # was main's: fetched again
    hub.log.clear()
    main(["download-c4", out, "--train", "0", "--revision", "v3"])  # other name, same bytes
    assert [m for m, *_ in hub.log] == ["HEAD"] and dest.read_bytes() == c4_shard(7)
    hub.log.clear()
    main(["download-c4", out, "--train", "0", "--revision", "v3"])
    assert hub.log == []  # the revision it holds: not asked again
    assert capsys.readouterr().out.split("\n")[1:4] == [
        f"[1/1] {name}: downloaded",
        f"[1/1] {name}: present",
        f"[1/1] {name}: present",
    ]


def test_an_interrupted_download_resumes(tmp_path, hub):
    name = shard_name("train", 2)
    data = hub.files[name]
    en = tmp_path / "c4" / "en"
    en.mkdir(parents=True)
    part = en / f".{name}.{hub.sha[name][:16]}.part"
    assert len(data) > 3000
    part.write_bytes(data[:1000])  # what a killed run leaves
    main(["download-c4", str(tmp_path / "c4"), "--train", "2"])
    assert (en / name).read_bytes() == data
    assert ("GET", name, "bytes=1000-") in hub.log  # only the rest was asked for
    assert not part.exists()


def test_a_checksum_mismatch_is_one_line(tmp_path, hub, capsys):
    name = shard_name("train", 0)
    data = bytearray(hub.files[name])
    data[len(data) // 2] ^= 0xFF
    hub.files[name] = bytes(data)  # corrupted in transit, same size
    with pytest.raises(SystemExit) as e:
        main(["download-c4", str(tmp_path / "c4"), "--train", "0"])
    assert e.value.code == 2
    msg = capsys.readouterr().err
    assert msg.count("\n") == 1, msg
    assert msg.startswith(f"error: {name}: sha256 ") and "differs from the hub's" in msg
    assert list((tmp_path / "c4" / "en").iterdir()) == []  # neither a final nor a partial file


def test_shard_specs_and_mistakes(capsys):
    assert parse_shards("train", "0-2,5,7-8") == [0, 1, 2, 5, 7, 8]
    assert parse_shards("validation", "all") == list(range(8))
    with pytest.raises(UserError, match="--validation 3-9: expected shard numbers from 0 to 7"):
        parse_shards("validation", "3-9")
    for argv, message in [
        (["out"], "error: give --train and/or --validation shards, e.g. --train 0-7\n"),
        (["out", "--train", "x"], "error: --train x: expected shard numbers from 0 to 1023 "),
    ]:
        with pytest.raises(SystemExit) as e:
            main(["download-c4", *argv])
        assert e.value.code == 2
        assert capsys.readouterr().err.startswith(message)
