"""`bert-lightning download-c4 OUT --train 0-7 --validation 0`: `allenai/c4` `en` shards from the
Hugging Face Hub into OUT/en/, resumable and checked against the hub's sha256.

huggingface_hub's `hf_hub_download` restarts an interrupted file from zero (its temporary file
is unique to the process and deleted on failure), so the file loop is ours and the HTTP is its:
`get_hf_file_metadata` (size, sha256, download location) and `http_get` (Range resume)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from bert_lightning.atomic import write_text
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import file_digest

REPO = "allenai/c4"
SPLITS = {"train": 1024, "validation": 8}  # shards per split in allenai/c4 `en`
SHA256 = re.compile(r"[0-9a-f]{64}")


class DownloadError(UserError):
    """A shard that could not be fetched or verified; the message is one line (exit 2)."""


def shard_name(split: str, index: int) -> str:
    return f"c4-{split}.{index:05d}-of-{SPLITS[split]:05d}.json.gz"


def parse_shards(split: str, spec: str) -> list[int]:
    """`0-7`, `0,3,10-12` or `all` -> sorted shard numbers of `split`."""
    n = SPLITS[split]
    if spec.strip() == "all":
        return list(range(n))
    out: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        lo, hi = (int(m[1]), int(m[2] or m[1])) if m else (1, 0)
        if not m or lo > hi or hi >= n:
            raise UserError(
                f"--{split} {spec}: expected shard numbers from 0 to {n - 1} "
                "as 'all', 'N', 'A-B' or a comma list of those"
            )
        out.update(range(lo, hi + 1))
    return sorted(out)


def download_file(
    filename: str, out_dir: Path, revision: str = "main", endpoint: str | None = None
) -> str:
    """Fetch `en/<filename>` of `revision` into out_dir/en/; returns what was done ('present',
    'downloaded', 'resumed'). A partial file `.<filename>.<sha256[:16]>.part` is continued by
    the next run; the final name appears only once the sha256 (when the hub gives one)
    matches, and `.<filename>.revision` records the revision and sha256 it was fetched as: a
    file present is that revision's, or the same bytes, else it is fetched again."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    dest = out_dir / "en" / filename
    record = dest.with_name(f".{filename}.revision")
    # a file fetched before records were kept: main's, the default then
    held, held_sha = record.read_text().split() if record.is_file() else ("main", "-")
    if dest.is_file() and held == revision:  # only a verified download gets this name
        return "present"
    dest.parent.mkdir(parents=True, exist_ok=True)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or constants.ENDPOINT
    url = hf_hub_url(REPO, f"en/{filename}", repo_type="dataset", revision=revision,
                     endpoint=endpoint)  # fmt: skip
    try:
        meta = get_hf_file_metadata(url, endpoint=endpoint)
    except Exception as e:
        raise DownloadError(f"{filename}: no metadata from {url}: {first_line(e)}") from e
    sha = meta.etag if meta.etag and SHA256.fullmatch(meta.etag) else None
    if (
        dest.is_file()
        and sha is not None
        and sha == (file_digest(dest) if held_sha == "-" else held_sha)
    ):
        write_text(record, f"{revision} {sha}\n")  # another revision, the same bytes
        return "present"
    part = dest.with_name(f".{filename}.{(sha or 'nosha')[:16]}.part")
    for stale in dest.parent.glob(f".{filename}.*.part"):
        if stale != part:  # a partial file of another revision of the shard
            stale.unlink()
    done = part.stat().st_size if part.exists() else 0
    if meta.size is not None and done > meta.size:
        part.unlink()
        done = 0
    with open(part, "ab") as f:
        try:
            http_get(
                meta.location,
                f,
                resume_size=done,
                headers=build_hf_headers(token=False),  # public data; location may be a CDN
                expected_size=meta.size,
                displayed_filename=filename,
            )
        except Exception as e:
            raise DownloadError(
                f"{filename}: download stopped at {part.stat().st_size} bytes ({first_line(e)}); "
                "run the command again to continue"
            ) from e
    if sha is not None and (got := file_digest(part)) != sha:
        part.unlink()
        raise DownloadError(
            f"{filename}: sha256 {got[:12]}... differs from the hub's {sha[:12]}...; "
            "the partial file was deleted, run the command again"
        )
    os.replace(part, dest)
    write_text(record, f"{revision} {sha or '-'}\n")
    return "resumed" if done else "downloaded"


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def download_c4(
    out_dir: str | Path,
    train: list[int] = (),
    validation: list[int] = (),
    revision: str = "main",
    endpoint: str | None = None,
    log=print,
) -> list[Path]:
    out_dir = Path(out_dir)
    names = [shard_name("train", i) for i in train]
    names += [shard_name("validation", i) for i in validation]
    for k, name in enumerate(names, 1):
        log(f"[{k}/{len(names)}] {name}: {download_file(name, out_dir, revision, endpoint)}")
    return [out_dir / "en" / n for n in names]


HELP = """\
Downloads allenai/c4 `en` shards from the Hugging Face Hub into OUT/en/ (the names
c4-train.XXXXX-of-01024.json.gz, c4-validation.XXXXX-of-00008.json.gz; about 320 MB
and 40 MB each). Shards: --train and --validation each take 'all', a number, a range 'A-B'
or a comma list ('0-7', '0,5,10-12'); train has shards 0-1023, validation 0-7. A shard
already in OUT/en/ as the revision asked for (or as the same bytes) is skipped; an
interrupted one continues from where it stopped on the next run; each is checked against
the hub's sha256 before it gets its final name.
HF_ENDPOINT (or --endpoint) points at a mirror."""


def register(sub) -> None:
    import argparse

    p = sub.add_parser(
        "download-c4",
        help="download allenai/c4 en shards (resumable, sha256-checked)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out_dir", metavar="OUT", help="the folder; shards land in OUT/en/")
    p.add_argument("--train", default="", metavar="SHARDS", help="train shards, e.g. 0-7")
    p.add_argument("--validation", default="", metavar="SHARDS", help="validation shards, e.g. 0")
    p.add_argument("--revision", default="main", help="a branch, tag or commit of allenai/c4")
    p.add_argument("--endpoint", help="the hub's address (default: HF_ENDPOINT or the hub)")
    p.set_defaults(func=_main)


def _main(args) -> None:
    if not (args.train or args.validation):
        raise UserError("give --train and/or --validation shards, e.g. --train 0-7")
    train = parse_shards("train", args.train) if args.train else []
    validation = parse_shards("validation", args.validation) if args.validation else []
    download_c4(args.out_dir, train, validation, args.revision, args.endpoint)
