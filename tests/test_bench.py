"""The benchmark scripts that bench/gpu_check.sh chains run end to end on tiny settings (on the
CPU), and the summary reads what they write: a GPU session must not find them broken.

A Python script runs in the test's process (`bench`: as `python bench/SCRIPT ARGS` runs it, its
`__main__` block on those arguments, without a new interpreter's imports); a shell script, and
what a script starts, in processes of their own."""

import contextlib
import ctypes
import json
import os
import re
import runpy
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.tasks.base import load_splits
from bert_lightning.tasks.kinds import make_task
from helpers import ROOT, run_in_session, subprocess_env

PR_SET_CHILD_SUBREAPER = 36  # prctl: orphans of this process's descendants come back to it


def processes() -> dict[int, tuple[str, int]]:
    """Each process's (state, parent), from /proc."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError, ValueError):
            continue
        out[int(stat.parent.name)] = (state, int(ppid))
    return out


def descendants(pid: int) -> set[int]:
    """The processes below `pid` that have not exited (a zombie has)."""
    children: dict[int, list[int]] = {}
    for child, (state, ppid) in processes().items():
        if state != "Z":
            children.setdefault(ppid, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def zombies(pid: int) -> set[int]:
    """The exited children of `pid` not yet reaped."""
    return {c for c, (state, ppid) in processes().items() if ppid == pid and state == "Z"}


def timed_out(signum, frame):
    raise TimeoutError("the script ran past 600 s")


@pytest.fixture
def bench(monkeypatch, capfd):
    """`python SCRIPT ARGS` in `cwd`, in this process: the script run as `__main__` (runpy) on
    `sys.argv`, bench/ importable, in the environment `subprocess_env` gives a subprocess (and
    the processes it starts); it must exit 0 within 600 s, and every process it started must
    have ended with it (this process takes in their orphans meanwhile, as a session would hold
    them). Returns what it wrote to stdout."""
    libc = ctypes.CDLL(None, use_errno=True)

    def run(script: str, *args: str, cwd: Path) -> str:
        monkeypatch.chdir(cwd)
        monkeypatch.syspath_prepend(str(ROOT / "bench"))
        for key, value in subprocess_env(ROOT / "bench").items():
            monkeypatch.setenv(key, value)
        monkeypatch.setattr(sys, "argv", [script, *args])
        environ = dict(os.environ)  # what the script sets (a seed) goes with it
        before = descendants(os.getpid()) | zombies(os.getpid())
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1)
        handler = signal.signal(signal.SIGALRM, timed_out)
        signal.alarm(600)
        capfd.readouterr()
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as e:
            assert e.code in (0, None), capfd.readouterr().err[-3000:]
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, handler)
            os.environ.clear()
            os.environ.update(environ)
            left = ended(before)
            libc.prctl(PR_SET_CHILD_SUBREAPER, 0)
        out, err = capfd.readouterr()
        sys.stderr.write(err)  # shown with a failing test's output
        assert not left, f"a process of {script} outlived it: {sorted(left)}"
        return out

    return run


def ended(before: set[int], seconds: float = 10.0) -> set[int]:
    """The processes below this one, not in `before`, still there after `seconds` (one that
    closed its output may take a moment to exit): killed, and the zombies left by them and by
    the orphans taken in reaped."""
    me = os.getpid()
    deadline = time.monotonic() + seconds
    while (left := descendants(me) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.1 if left else 0)
    for pid in zombies(me) - before:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return left


@pytest.mark.slow
def test_the_gpu_check_runs_on_the_cpu_and_its_summary_has_every_row(tmp_path):
    """`bash bench/gpu_check.sh --device cpu`: every part of the GPU session on tiny settings
    (fits eager and compiled against their bare steps, the bare step against transformers,
    padded batches, the large size, a short run) exits 0 and fills its row of the summary."""
    env = subprocess_env(ROOT / "bench")
    cmd = ["bash", str(ROOT / "bench/gpu_check.sh"), "--device", "cpu", ".whl", str(tmp_path)]
    r = run_in_session(cmd, env, 900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (tmp_path / "log.txt").read_text()
    assert log.count("== ") == 7 and log.count("exit 0") == 7, log
    summary = (tmp_path / "summary.md").read_text()
    for mode in ("eager", "compiled"):
        fit = json.loads((tmp_path / f"fit_{mode}.json").read_text())
        assert fit["fit_tok_s"] > 0 and fit["compiled"] == (None if mode == "eager" else "default")
        assert f"| train.py fit, {mode} (" in summary
        assert f"| bert_tiny bare step, {mode}, batch 2 x 16 |" in summary
    assert "| padded step packed" in summary and "| - |" not in summary


@pytest.mark.slow
def test_budget_curve_pretrains_each_budget_then_one_suite(tmp_path, bench):
    """bench/budget_curve.py on 3-second budgets: a run of ours (MLM and RTD) and of
    `transformers` per budget, one suite over them, each curve starting at the random row; a
    rerun redoes nothing. The `transformers` run is `python bench/hf_pretrain.py FOLDER
    OVERRIDES`: the same budget spent, a Hugging Face folder our reader loads, with the config's
    shape and the tokenizer train.py trains."""
    from tokenizers import Tokenizer

    from finetune_fixtures import tiny_budget, write_dataset
    from helpers import tiny_overrides, write_corpus

    write_corpus(tmp_path / "corpus.jsonl", 40)
    write_dataset(tmp_path / "data/glue_sst2", "sst2")
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("paths.")]
    args = [str(ROOT / "bench/budget_curve.py"), str(tmp_path / "curve"), "--minutes", "0.05"]
    args += ["--tasks", "sst2", "--seeds", "2", "--data-dir", str(tmp_path / "data")]
    args += ["--suite-budget", str(tiny_budget(tmp_path / "tiny.yaml")), *overrides]
    out = bench(*args, cwd=tmp_path)
    for t in ("ours", "rtd", "transformers"):
        assert f"pretraining {t}_0.05min" in out
    curve = tmp_path / "curve"
    assert (curve / "ours_0.05min/checkpoints/last.ckpt").is_file()
    assert read_checkpoint(curve / "rtd_0.05min/checkpoints/last.ckpt").rtd
    hf = curve / "transformers_0.05min"
    summary = json.loads((hf / "summary.json").read_text())
    assert summary["steps"] > 0 and summary["seconds"] >= 3.0 and summary["val_loss"] > 0
    printed = (curve / "transformers_0.05min.log").read_text().splitlines()
    assert json.loads(printed[-1]) == summary  # what hf_pretrain.py printed last
    model = read_checkpoint(hf / "hf_model")
    assert model.config.hidden_size == 32 and model.origin == "Hugging Face"
    for run in ("transformers", "ours"):  # as train.py trains it
        trained = Tokenizer.from_file(str(curve / f"{run}_0.05min/tokenizer.json"))
        assert model.tokenizer.get_vocab() == trained.get_vocab()
    models = json.loads((curve / "downstream/downstream.json").read_text())["models"]
    assert list(models) == ["ours_0.05min", "rtd_0.05min", "transformers_0.05min", "random"]
    points = json.loads((curve / "curve.json").read_text())["curve"]
    steps = {"transformers": json.loads((curve / "transformers_0.05min/summary.json").read_text())}
    for t in ("ours", "rtd", "transformers"):
        assert points[t][0] == [0.0, 0, *models["random"]["average"]]
        assert points[t][1][0] == 0.05 and points[t][1][2:] == models[f"{t}_0.05min"]["average"]
        assert points[t][1][1] > 0
    assert points["transformers"][1][1] == steps["transformers"]["steps"]
    table = (curve / "curve.md").read_text()
    assert table.splitlines()[2].startswith("| 0 (random weights) | ")
    assert table.splitlines()[3].startswith("| 0.05 | ") and (curve / "curve.png").stat().st_size
    again = bench(*args, cwd=tmp_path)  # finished runs and cells stay
    assert "pretraining ours" not in again and "pretraining rtd" not in again
    assert "pretraining transformers" not in again
    # a run stopped before its end (no .done) continues from its checkpoint, its budget spent
    ckpt = curve / "rtd_0.05min/checkpoints/last.ckpt"
    step = torch.load(ckpt, weights_only=True)["global_step"]
    (curve / "rtd_0.05min.done").unlink()
    assert f"continuing rtd_0.05min from {ckpt}" in bench(*args, cwd=tmp_path)
    assert step <= torch.load(ckpt, weights_only=True)["global_step"] <= step + 1
    assert "seed" not in again


@pytest.mark.slow
def test_ablation_runs_each_arm_on_the_same_budget(tmp_path, bench):
    """bench/ablate.py on 3-second budgets: one run per arm with the common overrides and its
    own, a table of steps, tokens/s and held-out figures; a rerun redoes nothing."""
    from helpers import tiny_overrides, write_corpus

    write_corpus(tmp_path / "corpus.jsonl", 40)
    overrides = [o for o in tiny_overrides(tmp_path) if not o.startswith("paths.")]
    sin = "model.position_embedding_init=sinusoidal optim.lr=3e-3"
    args = [str(ROOT / "bench/ablate.py"), str(tmp_path / "abl"), "--minutes", "0.05"]
    args += ["--arm", "base=", "--arm", f"sin={sin}", *overrides]
    out = bench(*args, cwd=tmp_path)
    assert "pretraining base (0.05 min)" in out and "pretraining sin (0.05 min)" in out
    arms = json.loads((tmp_path / "abl/ablation.json").read_text())["arms"]
    assert list(arms) == ["base", "sin"] and arms["sin"]["overrides"] == sin
    for name, init, lr in (("base", "normal", 1e-3), ("sin", "sinusoidal", 3e-3)):
        cfg = OmegaConf.load(tmp_path / "abl" / name / "config_resolved.yaml")
        assert (cfg.model.position_embedding_init, cfg.optim.lr) == (init, lr)
        assert cfg.trainer.max_time == "00:00:00:03"
        assert arms[name]["steps"] > 0 and arms[name]["val/loss"] > 0
    table = (tmp_path / "abl/ablation.md").read_text().splitlines()
    assert (
        table[0]
        == "| arm | overrides | steps | tokens/s (median) | val/loss | val/mlm_acc | val/ppl |"
    )
    assert table[2].startswith("| base | - | ") and table[3].startswith(f"| sin | `{sin}` | ")
    assert "pretraining" not in bench(*args, cwd=tmp_path)


@pytest.mark.slow
def test_padded_step_bench_times_every_workload(tmp_path, bench):
    """bench/padded_step.py on tiny settings: every workload's row, padding counted, and the
    controls (packed blocks, no padding) at 0%."""
    workloads = ["home_depot_cross", "home_depot_bi", "sst2", "nsp", "packed", "packed_isolated"]
    args = ["--workloads", *workloads, "--steps", "1", "--warmup", "0", "--batches", "2"]
    out = bench(
        str(ROOT / "bench/padded_step.py"),
        *args,
        "--batch-size",
        "4",
        "--no-bf16",
        "--json",
        str(tmp_path / "padded.json"),
        cwd=tmp_path,
    )
    rows = json.loads((tmp_path / "padded.json").read_text())
    assert [r["workload"] for r in rows] == workloads and all(r["dtype"] == "fp32" for r in rows)
    padding = {r["workload"]: r["padding"] for r in rows}
    assert padding["packed"] == padding["packed_isolated"] == 0
    assert all(0 < padding[w] < 1 for w in workloads[:3])
    assert all(r["vs_padded"] > 0 for r in rows) and rows[1]["vs_transformers"] is None
    assert out.count("| home_depot_cross | fp32 |") == 1


@pytest.mark.slow
def test_gpu_pretraining_pays_gathers_its_files_then_pretrains_both_and_runs_the_suite(tmp_path):
    """bench/gpu_carry.sh gathers the subset, the tokenizer, the suite's data and the wheels;
    bench/gpu_pretraining_pays.sh on them (CPU, tiny shape, 3-second budgets, one task): an MLM
    and an RTD run of experiment=gpu_10min, then the suite over both and random weights."""
    import gzip

    from finetune_fixtures import tiny_budget, write_dataset, write_tokenizer
    from helpers import write_corpus

    wb, suite, wheels = tmp_path / "wiki_books", tmp_path / "suite", tmp_path / "wheels"
    wb.mkdir()
    write_corpus(tmp_path / "corpus.jsonl", 40)
    lines = (tmp_path / "corpus.jsonl").read_text().splitlines(keepends=True)
    names = ["wikipedia-train-00000", "wikipedia-train-00006", "books-train-00002"]
    names += ["wikipedia-validation-00000", "books-validation-00000"]
    for i, name in enumerate(names):
        with gzip.open(wb / f"{name}.jsonl.gz", "wt") as f:
            f.writelines(lines[i * 8 : (i + 1) * 8])
    for task in ("glue_sst2", "glue_cola", "wnut17", "home_depot"):
        write_dataset(suite / task, task.removeprefix("glue_"))
    write_tokenizer(tmp_path / "tokenizer.json")
    wheels.mkdir()
    (wheels / "a-1.0-py3-none-any.whl").write_bytes(b"wheel")
    carry = tmp_path / "carry"
    args = [str(wb), str(suite), str(tmp_path / "tokenizer.json"), str(wheels), str(carry)]
    subprocess.run(["bash", str(ROOT / "bench/gpu_carry.sh"), *args], check=True)
    assert sorted(p.name for p in (carry / "data/wiki_books").iterdir()) == sorted(
        f"{n}.jsonl.gz" for n in names
    )
    assert (carry / "wheels/a-1.0-py3-none-any.whl").is_file()

    env = dict(
        os.environ,
        PYTHON=sys.executable,
        MINUTES="0.05",
        SEEDS="1",
        TASKS="sst2",
        SUITE_BUDGET=str(tiny_budget(tmp_path / "tiny.yaml")),
    )
    script = str(ROOT / "bench/gpu_pretraining_pays.sh")
    out = tmp_path / "pays"
    r = run_in_session(["bash", script, str(carry / "data"), str(out), "debug=tiny"], env, 600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert read_checkpoint(out / "rtd_0.05min/checkpoints/last.ckpt").rtd
    assert not read_checkpoint(out / "ours_0.05min/checkpoints/last.ckpt").rtd
    models = json.loads((out / "downstream/downstream.json").read_text())["models"]
    assert list(models) == ["ours_0.05min", "rtd_0.05min", "random"]
    assert (out / "curve.md").read_text().splitlines()[0].startswith("| pretraining minutes")


@pytest.mark.slow
def test_gpu_distill_carries_a_teacher_and_brings_back_both_students(tmp_path, bench):
    """bench/gpu_distill_carry.py packs a teacher (fp16, xz), text and wheels; bench/gpu_distill.sh
    on them (CPU, tiny shapes, 3-second budgets) distils and pretrains with MLM, each model
    comes back in fp16 shards, and --unpack makes folders the suite reads, equal to the
    checkpoints up to fp16 rounding."""
    import gzip

    from finetune_fixtures import write_hf_folder, write_tokenizer
    from helpers import write_corpus

    wb, wheels, teacher = tmp_path / "wiki_books", tmp_path / "wheels", tmp_path / "teacher"
    wb.mkdir()
    wheels.mkdir()
    write_hf_folder(teacher, write_tokenizer(tmp_path / "tokenizer.json"))
    lines = write_corpus(tmp_path / "corpus.jsonl", 40).read_text().splitlines(keepends=True)
    for i, name in enumerate(
        [
            "wikipedia-train-00006",
            "books-train-00002",
            "wikipedia-train-00000",
            "wikipedia-validation-00000",
        ]
    ):
        with gzip.open(wb / f"{name}.jsonl.gz", "wt") as f:
            f.writelines(lines[i * 10 : (i + 1) * 10])
    carry, out = tmp_path / "carry", tmp_path / "out"
    bench(
        str(ROOT / "bench/gpu_distill_carry.py"),
        str(carry),
        str(wb),
        str(wheels),
        str(teacher),
        cwd=tmp_path,
    )
    assert sorted(p.name for p in (carry / "teacher").iterdir()) == [
        "config.json",
        "model.safetensors.xz",
        "tokenizer.json",
    ]
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        ACCELERATOR="cpu",
        MINUTES="0.05",
        BATCH="4",
        WORK=str(tmp_path / "work"),
    )
    tiny = [
        "model.hidden_size=32",
        "model.num_hidden_layers=2",
        "model.num_attention_heads=2",
        "model.intermediate_size=64",
        "data.max_seq_length=32",
        "trainer.val_check_interval=2",
    ]
    r = run_in_session(
        ["bash", str(ROOT / "bench/gpu_distill.sh"), str(carry), str(out), *tiny], env, 600
    )
    assert r.returncode == 0 and r.stdout.count("exit 0") == 2, r.stdout + r.stderr[-3000:]
    bench(
        str(ROOT / "bench/gpu_distill_carry.py"),
        "--unpack",
        str(out),
        str(tmp_path / "hf"),
        cwd=tmp_path,
    )
    for arm in ("distill", "mlm"):
        back = read_checkpoint(tmp_path / "hf" / arm)
        trained = read_checkpoint(tmp_path / "work" / arm / "checkpoints/last.ckpt")
        assert back.config.hidden_size == 32 and back.state_dict.keys() <= trained.state_dict.keys()
        for k, v in back.state_dict.items():
            torch.testing.assert_close(v, trained.state_dict[k].float(), atol=2e-3, rtol=1e-3)


@pytest.mark.slow
def test_rtd_step_bench_times_both_objectives(tmp_path, bench):
    """bench/rtd_step.py on a tiny batch: both step times, their ratio and the sampling share."""
    args = ["--size", "bert_tiny", "--vocab-size", "500", "--batch-size", "4", "--seq-len", "16"]
    args += ["--steps", "2", "--warmup", "1"]
    r = json.loads(bench(str(ROOT / "bench/rtd_step.py"), *args, cwd=tmp_path).splitlines()[-1])
    assert r["mlm_ms"] > 0 and r["rtd_ms"] > 0
    # the times are printed to 0.1 ms, the ratio from the unrounded times: allow their rounding
    slack = r["rtd_over_mlm"] * (0.05 / r["mlm_ms"] + 0.05 / r["rtd_ms"]) + 0.0005
    assert abs(r["rtd_over_mlm"] - r["rtd_ms"] / r["mlm_ms"]) <= slack
    assert 0 < r["sampling_share_of_rtd"] < 1


@pytest.mark.slow
def test_the_onnx_backends_bench_runs_each_backend(tmp_path, bench):
    """bench/onnx_backends.py on a tiny fine-tuned checkpoint and a tiny embedding model: each
    backend's speed, its scores' difference to PyTorch's on the test file's rows, and another
    encoder timed beside the model's int8."""
    from finetune_fixtures import (
        ad_rows,
        relevance_ckpt,
        write_csv,
        write_hf_folder,
        write_tokenizer,
    )

    tok = write_tokenizer(tmp_path / "tokenizer.json")
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    write_hf_folder(tmp_path / "hf", tok)
    test = write_csv(
        tmp_path / "test.csv", [{**r, "label": int(r["label"] >= 2)} for r in ad_rows(4)]
    )
    out = bench(
        str(ROOT / "bench/onnx_backends.py"),
        *["--model", str(ckpt), "--embedder", str(tmp_path / "hf"), "--pairs", "32"],
        *["--one-at-a-time", "4", "--rounds", "2", "--json", str(tmp_path / "o.json")],
        *["--vs", f"small={tmp_path / 'hf'}", "--fp32-top", "2", "--test", str(test)],
        cwd=tmp_path,
    )
    got = json.loads((tmp_path / "o.json").read_text())
    top = "int8, top 2 fp32"
    assert list(got["pairs_per_s"]) == ["torch", "onnx", "int8", top, "int8, small"]
    runs = got["rounds_pairs_per_s"]
    for b in ("batch 1", "batch 32"):
        each = [s / m for s, m in zip(runs["int8, small"][b], runs["int8"][b], strict=True)]
        assert got["speedup_vs_int8"]["int8, small"][b] == round(statistics.median(each), 2)
    diff = got["score_diff_vs_torch"]
    assert list(diff) == ["onnx", "int8", top] and got["score_diff_rows"] == 12
    assert diff["onnx"]["max"] <= 1e-4
    assert diff[top]["max"] <= 1e-3  # every layer fp32; quantize_dynamic's rewrite reorders sums
    assert diff["int8"]["mean"] <= diff["int8"]["p99"] <= diff["int8"]["max"]
    assert 0 <= diff["int8"]["crosses_0.5"] <= 1
    assert got["embedding_cosine_to_torch"]["onnx"]["min"] > 0.9999
    assert "| int8, small |" in out and list(got["test_metrics"]) == ["torch", "onnx", "int8", top]
    assert got["speedup_vs_torch"]["torch"] == {"batch 1": 1.0, "batch 32": 1.0}


@pytest.mark.slow
def test_the_int8_variants_bench_scores_each_variant(tmp_path, bench):
    """bench/int8_variants.py on a tiny fine-tuned checkpoint: each variant (every Linear, each
    kind, each layer, 7-bit and unsigned weights, the weights alone rounded) scored against
    PyTorch on the test file's rows, and timed against fp32."""
    from finetune_fixtures import ad_rows, relevance_ckpt, write_csv, write_tokenizer

    tok = write_tokenizer(tmp_path / "tokenizer.json")
    ckpt, _ = relevance_ckpt(tmp_path, tok)
    test = write_csv(
        tmp_path / "test.csv", [{**r, "label": int(r["label"] >= 2)} for r in ad_rows(4)]
    )
    bench(
        str(ROOT / "bench/int8_variants.py"),
        *["--model", str(ckpt), "--test", str(test), "--speed", "1"],
        *["--out", str(tmp_path / "o.json")],
        cwd=tmp_path,
    )
    got = json.loads((tmp_path / "o.json").read_text())
    kinds = [f"only {k} int8" for k in ("q/k/v", "attention output", "FFN in", "FFN out")]
    layers = [f"only layer {i} int8" for i in range(2)]
    assert got["rows"] == 12 and list(got["variants"]) == [
        "every Linear int8 (--quantize int8)",
        *kinds,
        *layers,
        "reduce_range (7-bit weights)",
        "QUInt8 weights",
        "weights rounded to int8, fp32 arithmetic",
    ]
    for r in got["variants"].values():
        assert r["p50"] <= r["p99"] <= r["max"] and 0 <= r["across_0.5"] <= 1 and r["over_fp32"] > 0


def test_the_onnx_speedup_is_the_median_of_each_rounds_ratio(monkeypatch):
    """A round where the machine ran slow slows both sides: the ratio within each round."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from onnx_backends import medians

    runs = {"torch": {"b": [100.0, 50.0, 90.0]}, "int8": {"b": [300.0, 100.0, 180.0]}}
    rates, speedup = medians(runs)
    assert rates == {"torch": {"b": 90.0}, "int8": {"b": 180.0}}
    assert speedup == {"torch": {"b": 1.0}, "int8": {"b": 2.0}}
    runs["int8"]["b"] = [300.0, 150.0, 300.0]  # ratios 3, 3, 3.33; medians' ratio 3.33
    assert medians(runs)[1]["int8"] == {"b": 3.0}


def test_the_load_tests_ratios_are_over_torch_and_over_the_models_own_backend(monkeypatch):
    """bench/serve.py's summary, two backends and a `--vs` encoder over two rounds: each setup
    over torch, and the other encoder over the model on the same backend, round by round."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from serve import ratios

    setups = ["torch", "int8", "torch, small", "int8, small"]
    per_round = [
        {"torch": 10.0, "int8": 30.0, "torch, small": 20.0, "int8, small": 90.0},
        {"torch": 5.0, "int8": 20.0, "torch, small": 10.0, "int8, small": 40.0},
    ]
    assert ratios(per_round, setups, 2) == {
        "requests_per_s_vs_torch": {"torch": 1.0, "int8": 3.5, "torch, small": 2.0,
                                    "int8, small": 8.5},
        "requests_per_s_vs_model": {"torch, small": 2.0, "int8, small": 2.5},
    }  # fmt: skip
    no_torch = [{k: v for k, v in r.items() if k.startswith("int8")} for r in per_round]
    assert ratios(no_torch, ["int8", "int8, small"], 1) == {
        "requests_per_s_vs_torch": None,
        "requests_per_s_vs_model": {"int8, small": 2.5},
    }


@pytest.mark.slow
def test_paired_runs_scores_both_runs_on_their_shared_test_rows(tmp_path, bench):
    """bench/paired_runs.py on two tiny ranking runs (one split, two learning rates): each
    run's per-query figures are the ones its own test wrote, and the difference is paired."""
    from bert_lightning.config import compose
    from bert_lightning.training.finetune import finetune
    from finetune_fixtures import overrides, task_files, write_tokenizer

    write_tokenizer(tmp_path / "tokenizer.json")
    files = task_files(tmp_path, "ad_relevance")
    own = {}
    for name, lr in (("a", "1e-3"), ("b", "1e-2")):
        out = f"paths.output_dir={tmp_path / name}"
        cfg = compose(
            "finetune", overrides(tmp_path, "ad_relevance", *files, out, f"optim.lr={lr}")
        )
        own[name] = finetune(cfg)["ranking"]["fine-tuned"]
    bench(
        str(ROOT / "bench/paired_runs.py"),
        *[str(tmp_path / "a"), str(tmp_path / "b"), "--json", str(tmp_path / "p.json")],
        cwd=tmp_path,
    )
    got = json.loads((tmp_path / "p.json").read_text())
    assert list(got) == ["a", "b", "a - b"]
    for name in ("a", "b"):
        for m, c in got[name].items():
            assert c["mean"] == pytest.approx(own[name][m]["mean"], abs=1e-6), (name, m)
    for m in ("ndcg@10", "mrr"):  # defined for the same queries in both: a difference of means
        want = got["a"][m]["mean"] - got["b"][m]["mean"]
        assert got["a - b"][m]["mean"] == pytest.approx(want, abs=1e-6)


@pytest.mark.slow
def test_recipe_arms_gives_each_arm_minus_the_zero_shot_encoder_in_and_out_of_domain(
    tmp_path, bench
):
    """bench/recipe_arms.py on two tiny bi-encoder runs of one split, the first run's own
    encoder as the zero-shot one: a bi-encoder's score is its cosine scaled, so the first arm
    orders every query as its zero-shot cosine does (a difference of 0); the second differs by
    its own figures' difference; a file read as the "other" set gives the same; seeds pool."""
    from bert_lightning.config import compose
    from bert_lightning.training.finetune import finetune
    from finetune_fixtures import overrides, task_files, write_tokenizer

    write_tokenizer(tmp_path / "tokenizer.json")
    files = task_files(tmp_path, "ad_relevance")
    bi = ["task.architecture=bi_encoder", "task.pooling=mean", "task.baselines=true"]
    best = {}
    for name, lr in (("a", "1e-3"), ("b", "1e-2")):
        out = f"paths.output_dir={tmp_path / name}"
        cfg = compose(
            "finetune", overrides(tmp_path, "ad_relevance", *files, *bi, out, f"optim.lr={lr}")
        )
        best[name] = str(tmp_path / name / finetune(cfg)["best_checkpoint"])
    test_file = tmp_path / "test.tsv"
    cfg = compose("finetune", overrides(tmp_path, "ad_relevance", *files, *bi))
    _, tables = load_splits(make_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.seed)
    t, lo, hi = tables["test"], cfg.task.grade_min, cfg.task.grade_max
    grades = [lo + y * (hi - lo) for y in t["target"]]
    pd.DataFrame({"query": t["text"], "ad": t["pair"], "label": grades}).to_csv(
        test_file, sep="\t", index=False
    )
    args = ["--zero-shot", best["a"], "--json", str(tmp_path / "s1.json")]
    args += ["--other", str(test_file), f"a={best['a']}", f"b={best['b']}"]
    printed = bench(str(ROOT / "bench/recipe_arms.py"), *args, cwd=tmp_path)
    got = json.loads((tmp_path / "s1.json").read_text())
    for where in ("home_depot", "other"):
        diff = got[where]["a - zero_shot"]
        assert all(v == 0 or v != v for m in diff["per_query"].values() for v in m)  # v != v: NaN
        assert diff["global_spearman"] == pytest.approx(0, abs=1e-6)
        own = got[where]["per_query"]
        want = own["b"]["ndcg@10"]["mean"] - own["zero_shot"]["ndcg@10"]["mean"]
        assert np.nanmean(got[where]["b - zero_shot"]["per_query"]["ndcg@10"]) == pytest.approx(
            want, abs=1e-6
        )
    assert got["other"]["b - zero_shot"] == got["home_depot"]["b - zero_shot"]
    assert "home_depot (seeds [" in printed and "\nb " in printed
    for where in ("home_depot", "other"):  # a second seed that ran arm a alone
        del got[where]["b - zero_shot"]
    (tmp_path / "s2.json").write_text(json.dumps(got))
    pooled = bench(str(ROOT / "bench/recipe_arms.py"), "--combine", str(tmp_path / "s1.json"),
                   str(tmp_path / "s2.json"), cwd=tmp_path)  # fmt: skip
    assert "± 0.000" in pooled and "\na " in pooled and "\nb " not in pooled  # the arms both ran


def test_the_pooled_recipe_table_in_the_docs_is_what_the_kept_seeds_give(monkeypatch):
    """docs/finetuning-results.md's pooled table of the Home Depot recipe's arms: every interval and
    mean ± std `recipe_arms.py --combine` gives over bench/results/recipe_arms/s*.json."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    from recipe_arms import combine, table

    kept = [str(ROOT / f"bench/results/recipe_arms/s{seed}.json") for seed in (1234, 2, 3)]
    pooled = table(combine(kept))
    doc = (ROOT / "docs/finetuning-results.md").read_text().replace("**", "")
    cells = re.findall(r"[+-]\d\.\d{3} (?:\[[+-]\d\.\d{3}, [+-]\d\.\d{3}\]|± \d\.\d{3})", pooled)
    assert len(cells) == 4 * 2 * 3  # arms x sets x figures
    for cell in cells:
        assert cell in doc, cell


@pytest.mark.slow
def test_first_step_times_a_runs_first_step_and_its_validations(tmp_path, bench):
    from helpers import tiny_overrides, write_corpus

    write_corpus(tmp_path / "corpus.jsonl")
    run = tiny_overrides(tmp_path, "trainer.val_check_interval=3")
    out = bench(str(ROOT / "bench/first_step.py"), "--json", str(tmp_path / "f.json"), *run,
                cwd=tmp_path)  # fmt: skip
    got = json.loads((tmp_path / "f.json").read_text())
    assert got["exit"] == 0 and got["validation_steps"] == [0, 3, 6]
    # each validation's seconds are printed to 0.1 s: a tiny run's may all read 0.0
    assert 0 < got["first_step_s"] < got["wall_s"] and 0 <= got["validation_s"] < got["wall_s"]
    assert f"first step after {got['first_step_s']:.0f} s; 3 validations" in out


@pytest.mark.slow
def test_task_text_writes_the_training_splits_distinct_texts_and_nothing_else(tmp_path, bench):
    """bench/task_text.py: the texts a ranking run trains on, once each; the test queries'
    rows (other groups) stay out."""
    from bert_lightning.config import compose
    from bert_lightning.tasks.base import load_splits
    from bert_lightning.tasks.kinds import make_task
    from finetune_fixtures import task_files

    files = ["task=ad_relevance", *task_files(tmp_path, "ad_relevance")]
    out = bench(str(ROOT / "bench/task_text.py"), str(tmp_path / "t.jsonl"), *files, cwd=tmp_path)
    got = [json.loads(line)["text"] for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    cfg = compose("finetune", [*files, "paths.output_dir=."])
    _, tables = load_splits(make_task(OmegaConf.to_container(cfg.task, resolve=True)), cfg.seed)
    train = tables["train"]
    assert sorted(got) == sorted(set(train["text"]) | set(train["pair"]))
    assert len(got) == len(set(got)) and f"{len(got)} texts of {len(train['group'])}" in out
    held_out = set(tables["test"]["text"]) - set(train["text"])
    assert held_out and not held_out & set(got)


@pytest.mark.slow
def test_time_to_loss_trains_both_on_the_same_budget(tmp_path, bench):
    """bench/time_to_loss.py on a 2-second budget: both trainers step and are scored."""
    out = bench(str(ROOT / "bench/time_to_loss.py"), "--budget", "2", "--size", "bert_tiny",
                cwd=tmp_path)  # fmt: skip
    rows = [line.split() for line in out.splitlines() if "validation MLM loss" in line]
    assert [r[0] for r in rows] == ["ours", "transformers"]
    assert all(int(r[1]) > 0 and float(r[-1]) > 0 for r in rows)


@pytest.mark.slow
def test_data_pipeline_reports_each_figure(tmp_path, bench):
    """bench/data_pipeline.py once, on 200 documents: throughput of both cache formats,
    packing, RSS, headroom."""
    args = ["--repeats", "1", "--docs", "200"]
    got = json.loads(bench(str(ROOT / "bench/data_pipeline.py"), *args, cwd=tmp_path))
    assert set(got) == {"throughput", "packing", "rss", "headroom"}
    assert got["packing"]["document"]["examples"] == 150  # a document each, 50 held out
    assert got["headroom"]["bert_mini_steps_per_s"] > 0 and got["headroom"]["headroom"] > 0


def test_brackets_seeds_prints_a_row_per_seed(tmp_path, monkeypatch, capsys):
    """bench/brackets_seeds.py: the report's runs per seed (`run_all`, tested in
    test_brackets.py), one row each of the MLM accuracy and the fine-tuning runs."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import brackets_seeds

    seen = []

    def run_all(out_dir, extra, variants):
        seen.append((out_dir, extra, variants))
        return {"bidirectional": {"overall": 90.0}, "finetune": {"head only": 55.5, "all": 97.0}}

    monkeypatch.setattr(brackets_seeds, "run_all", run_all)
    monkeypatch.setattr(sys, "argv", ["brackets_seeds.py", str(tmp_path), "7", "8"])
    brackets_seeds.main()
    assert [(s[0].name, s[1][0], s[2]) for s in seen] == [
        ("seed7", "seed=7", ["bidirectional"]),
        ("seed8", "seed=8", ["bidirectional"]),
    ]
    out = capsys.readouterr().out
    assert "| seed | MLM accuracy | head only | all |" in out
    assert "| 7 |  90.0 |  55.5 |  97.0 |" in out


def test_a_script_that_leaves_a_process_fails_the_in_process_runner(tmp_path, bench):
    """A process a script started (here an orphan: its shell exited) outliving the script
    fails the test, as a session that outlives its output does (`run_in_session`), and is
    killed."""
    script = tmp_path / "leaves.py"
    script.write_text("import subprocess\nsubprocess.run(['sh', '-c', 'sleep 60 &'])\n")
    before = descendants(os.getpid())
    with pytest.raises(AssertionError, match="outlived it"):
        bench(str(script), cwd=tmp_path)
    assert descendants(os.getpid()) <= before


@pytest.mark.slow
def test_rank_catalogue_measures_the_index_the_endpoints_and_retrieval(tmp_path, bench):
    """bench/rank_catalogue.py on a tiny Home Depot file: the whole catalogue indexed, both
    endpoints loaded without errors, recall within [0, 1] and growing with k, for the model and
    BM25 alike."""
    from finetune_fixtures import write_dataset

    data = write_dataset(tmp_path / "hd", "home_depot")
    out = tmp_path / "rank.json"
    args = ["--data-dir", str(data), "--seconds", "1", "--json", str(out)]
    bench(str(ROOT / "bench/rank_catalogue.py"), *args, cwd=tmp_path)
    got = json.loads(out.read_text())
    titles = pd.read_csv(data / "train.csv.zip", encoding="latin-1")["product_title"]
    assert got["catalogue"] == titles.nunique() and got["vectors_per_s"] > 0
    recall = got["retrieval"]
    for who in ("model", "bm25"):
        at10, at100 = (recall[f"recall@{k}"][who]["mean"] for k in (10, 100))
        assert 0 <= at10 <= at100 <= 1
    names = ("rank_top10", "rank_100_ids", "score_100_pairs", "rank_top10_hnsw",
             "rank_top10_int8", "rank_top10_int8_hnsw")  # fmt: skip
    error = got["int8_query_score_error"]
    assert error["rows"] > 0 and 0 <= error["p50"] <= error["p99"] <= error["max"] < 0.2
    assert set(got["load"]) == {f"{name}_{c}_clients" for name in names for c in (1, 16)}
    assert got["hnsw"]["recall@10_of_exact"] == 1.0  # a tiny catalogue: HNSW finds them all
    assert all(v["errors"] == 0 and v["requests"] > 0 for v in got["load"].values())


@pytest.mark.slow
def test_silences_times_the_longest_gap_of_each_command(tmp_path, bench):
    """bench/silences.py --tiny on two guide commands: `python train.py` kept training (a step
    budget it cannot spend) is cut by SIGTERM and stops with its checkpoint, exit 143; `score`
    (its checkpoint made first by a tiny fine-tuning run) ends by itself. Each command's longest
    silence is the largest of its gaps, from the start through every line to its exit, and the
    lines around it are its output's."""
    import itertools
    import tempfile

    out = tmp_path / "silences.json"
    args = ["--tiny", "--only", "get-started,score", "--seconds", "40", "--out", str(out)]
    printed = bench(str(ROOT / "bench/silences.py"), *args, "--extra", "trainer.max_steps=100000",
                    cwd=tmp_path)  # fmt: skip
    got = {r["name"]: r for r in json.loads(out.read_text())["commands"]}
    assert list(got) == ["get-started", "score"]
    for r in got.values():
        times = [t for t, _ in r["timeline"]]
        edges = [0.0, *times, r["seconds"]]
        gaps = [b - a for a, b in itertools.pairwise(edges)]
        assert r["lines"] == len(times) > 0 and min(gaps) >= 0
        assert r["longest_silence_s"] == pytest.approx(max(gaps), abs=0.02)
        at = max(range(len(gaps)), key=gaps.__getitem__)
        assert r["before"] == (r["timeline"][at - 1][1] if at else None)
        assert r["after"] == (r["timeline"][at][1] if at < len(times) else None)
        assert f"| {r['name']} | {r['longest_silence_s']:.1f} |" in printed
        assert tempfile.gettempdir() not in json.dumps(r)  # no machine's paths
    cut, score = got["get-started"], got["score"]
    assert cut["ended"] == "cut" and cut["exit_code"] == 143 and not cut["killed"]
    assert 40 <= cut["seconds"] < 40 + 60 and "step" in cut["phases"]
    assert "stopped on request" in cut["timeline"][-1][1]  # its last line, then the exit
    assert cut["ran"] == "train.py debug=tiny trainer.max_steps=100000"
    assert score["ended"] == "itself" and score["exit_code"] == 0 and score["seconds"] < 40
    assert score["setup"]["command"].endswith("debug=tiny") and "score" in score["phases"]
    assert score["timeline"][-1][1] == "wrote 36 scored rows to scored.csv"
