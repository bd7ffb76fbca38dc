"""Data pipeline figures on the bundled C4 sample (CPU): `python bench/data_pipeline.py`.

1. tokenize + pack throughput (MB/s of JSON input, tokens/s), 1 and 2 processes, and the two
   cache formats: flat uint16 token arrays (data/prepare.py) vs the `datasets` Arrow cache;
   bytes per token on disk and random block reads/s of each;
2. packing efficiency: the share of non-padding tokens per batch, packed vs per document;
3. RSS of a training data loader (token arrays, memory-mapped) over the corpus 1x and 20x
   (repeated), a full epoch each, in a fresh process (Linux /proc figures);
4. data loader batches/s vs the training steps/s of bert_mini (what the loader must keep up with).
Timings are medians of `--repeats` runs, measured side by side in one process. `--docs N`:
the sample's first N documents only (the tests' dry run).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra.utils import instantiate

from bert_lightning.config import bundled, compose, configured
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.masking import MLMCollator
from bert_lightning.data.prepare import TokenBlocks, cache_folder, prepare, shard_paths
from bert_lightning.data.sampling import EpochSampler, SeededExamples
from bert_lightning.data.tokenizer import load_tokenizer, save_tokenizer, train_wordpiece
from bert_lightning.model import BertForPreTraining

SAMPLE = bundled("c4_sample.jsonl")


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def split_sample(out: Path, n: int, sample: str) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    lines = Path(sample).read_text().splitlines(keepends=True)
    files = []
    for i in range(n):
        p = out / f"c4-train.{i:05d}-of-{n:05d}.json"
        p.write_text("".join(lines[i::n]))
        files.append(str(p))
    return files


def throughput(tok, work: Path, repeats: int, sample: str) -> dict:
    files = split_sample(work / "shards", 8, sample)
    mb = sum(Path(f).stat().st_size for f in files) / 1e6
    res = {}
    for procs in (1, 2):

        def run(procs=procs):
            out = work / f"tok{procs}"
            shutil.rmtree(out, ignore_errors=True)
            prepare(files, out, tok, num_proc=procs, read={})

        t = median_time(run, repeats)
        n_tokens = sum(int(np.load(shard_paths(work / f"tok{procs}", f, {})[1])[-1]) for f in files)
        res[f"tokens_{procs}proc"] = {"MB_per_s": mb / t, "tokens_per_s": n_tokens / t}

    def run_arrow():  # one process: datasets.map uses num_proc from 10,000 documents on
        dm = configured(
            "data",
            train_files=files,
            val_files=files[0],
            cache_dir=str(work / f"arrow_{time.perf_counter_ns()}"),
            out_dir=None,
        )
        dm.examples(dm.read(files), tok)

    t = median_time(run_arrow, repeats)
    res["arrow_1proc"] = {"MB_per_s": mb / t, "tokens_per_s": n_tokens / t}
    # disk and random block reads
    out = work / "tok1"
    blocks = TokenBlocks(files, out, {}, 126, 2, 3, "packed")
    tok_bytes = sum(shard_paths(out, f, {})[0].stat().st_size for f in files)
    dm = configured(
        "data",
        train_files=files,
        val_files=files[0],
        cache_dir=str(work / "ar"),
        out_dir=None,
    )
    arrow = dm.examples(dm.read(files), tok)
    arrow_bytes = sum(
        Path(c["filename"]).stat().st_size
        for c in arrow.cache_files
        if "tokenizing" not in c["filename"]
    )
    idx = np.random.default_rng(0).integers(0, min(len(blocks), len(arrow)), 2000)
    t_tok = median_time(lambda: [blocks[int(i)] for i in idx], repeats)
    t_arr = median_time(lambda: [arrow[int(i)] for i in idx], repeats)
    res["disk_bytes_per_token"] = {
        "tokens": tok_bytes / n_tokens,
        "arrow_blocks": arrow_bytes / (len(arrow) * 128),
    }
    res["random_block_reads_per_s"] = {"tokens": len(idx) / t_tok, "arrow": len(idx) / t_arr}
    return res


def packing_efficiency(tok, work: Path, sample: str) -> dict:
    res = {}
    for packing in ("packed", "document"):
        dm = configured(
            "data",
            train_files=sample,
            packing=packing,
            cache_dir=str(work / "pack"),
            out_dir=None,
        )
        dm.build_tokenizer(tok)
        dm.setup()
        real = total = 0
        for batch in dm.train_dataloader():
            mask = batch.get("attention_mask")
            real += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
            total += batch["input_ids"].numel()
        res[packing] = {"non_padding_share": real / total, "examples": len(dm.train_set)}
    return res


def masking():
    """The shipped data config's masking (a data module built without a run folder)."""
    return configured("data", out_dir=None).masking


def rss_child(token_dir: str, n_copies: int) -> None:
    """Run in a fresh process: a full epoch of the training loader; prints peak RSS (MB)."""
    files = copies(Path(token_dir))[:n_copies]
    blocks = TokenBlocks(files, Path(token_dir), {}, 126, 2, 3, "packed")
    collate = MLMCollator(0, 4, [0, 1, 2, 3, 4], 8192, masking())
    loader = torch.utils.data.DataLoader(
        SeededExamples(blocks, 0),
        batch_size=32,
        sampler=EpochSampler(blocks, seed=0),
        collate_fn=collate,
    )
    before = _status("VmRSS")
    n = sum(1 for _ in loader)
    print(
        json.dumps(
            {
                "batches": n,
                "rss_before_epoch_MB": before,
                "rss_after_epoch_MB": _status("VmRSS"),
                "peak_rss_MB": _status("VmHWM"),
                "anon_rss_after_MB": _status("RssAnon"),  # RSS less the file-backed pages
            }
        )
    )


def _status(key: str) -> float:
    """A memory figure of this process from /proc (Linux), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def copies(token_dir: Path) -> list[str]:
    """The sample's 20 copies whose shards `rss` wrote into `token_dir`."""
    return [str(token_dir.parent / f"copy{i}.json") for i in range(20)]


def rss(tok, work: Path, sample: str) -> dict:
    out = cache_folder(work / "rss", tok)
    prepare([sample], out, tok, 1, {})
    src_tokens, src_docs = shard_paths(out, sample, {})
    for copy in copies(out):  # the corpus 20 times: 20 shards with the sample's arrays
        shutil.copy(sample, copy)
        dst_tokens, dst_docs = shard_paths(out, copy, {})
        shutil.copy(src_tokens, dst_tokens)
        shutil.copy(src_docs, dst_docs)
    res = {}
    for n in (1, 20):
        cmd = [sys.executable, __file__, "--rss-child", str(out), str(n)]
        line = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
        res[f"{n}x"] = json.loads(line.strip().splitlines()[-1])
    return res


def headroom(tok, work: Path, repeats: int, sample: str) -> dict:

    out = cache_folder(work / "rss", tok)
    blocks = TokenBlocks([sample], out, {}, 126, 2, 3, "packed")
    collate = MLMCollator(0, 4, [0, 1, 2, 3, 4], tok.get_vocab_size(), masking())
    loader = torch.utils.data.DataLoader(
        SeededExamples(blocks, 0),
        batch_size=32,
        sampler=EpochSampler(blocks, seed=0),
        collate_fn=collate,
    )
    n_batches = sum(1 for _ in loader)
    t_load = median_time(lambda: sum(1 for _ in loader), repeats)
    cfg = compose(overrides=["model=bert_mini", "paths.output_dir=."])
    model = BertForPreTraining(instantiate(cfg.model, vocab_size=tok.get_vocab_size()))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = next(iter(loader))

    def step():
        out = model(
            batch["input_ids"], labels=batch["labels"], mlm_positions=batch["mlm_positions"]
        )
        out.loss.backward()
        opt.step()
        opt.zero_grad()

    step()
    t_step = median_time(step, repeats * 3)
    return {
        "loader_batches_per_s": n_batches / t_load,
        "bert_mini_steps_per_s": 1 / t_step,
        "headroom": (n_batches / t_load) * t_step,
        "threads": torch.get_num_threads(),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--docs", type=int, help="the sample's first DOCS documents, 100 or more (default: all)"
    )
    p.add_argument("--rss-child", nargs=2, metavar=("TOKEN_DIR", "COPIES"))
    args = p.parse_args()
    lines = Path(SAMPLE).read_text().splitlines(keepends=True)
    if args.docs is not None and not 100 <= args.docs <= len(lines):
        p.error(f"--docs {args.docs}: give 100 to {len(lines)} (the sample's; 50 are held out)")
    if args.rss_child:
        return rss_child(args.rss_child[0], int(args.rss_child[1]))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sample = SAMPLE
        if args.docs:
            sample = str(work / "sample.jsonl")
            Path(sample).write_text("".join(lines[: args.docs]))
        docs = list(iter_documents([sample]))
        tok = train_wordpiece(lambda: iter(docs), vocab_size=8192)
        save_tokenizer(tok, work / "tokenizer.json")
        tok = load_tokenizer(work / "tokenizer.json")
        results = {
            "throughput": throughput(tok, work, args.repeats, sample),
            "packing": packing_efficiency(tok, work, sample),
            "rss": rss(tok, work, sample),
            "headroom": headroom(tok, work, args.repeats, sample),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
