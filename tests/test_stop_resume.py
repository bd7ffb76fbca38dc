"""A stop is invisible: each tiny job runs whole once (per test session), then again stopped by
SIGTERM in one phase and resumed in its own folder (`ckpt_path=` its `last.ckpt`; after a stop
in the data pass, which saves nothing, the same command again), and the two runs agree on what
a run leaves: the batches trained on, in order; every row of `metrics.csv` (every validation
with its step); the checkpoints kept, the best one by name, score and weights; `last.ckpt`
(weights, optimizer, schedule, step, callbacks' state) bit for bit; `results.json`.

What follows a fit (fine-tuning's test, its baselines) cannot be continued half-way: the
resumed run redoes it from its start, as the stop's line says. A stop in the fit's last
validation lets it finish (no step is left to redo it at). Pretraining jobs train 8 steps,
validating and checkpointing every 4; fine-tuning ones 8 steps validating every 2, or epochs
of 8 steps validated at their end with early stopping."""

import csv
import hashlib
import json
import os
import signal
from pathlib import Path

import lightning as L
import pytest
import torch
from filelock import FileLock

from bert_lightning.config import compose
from bert_lightning.signals import STOP_SIGNALS, Interrupted
from bert_lightning.tasks.ad_relevance import AdRelevance
from bert_lightning.training.finetune import finetune
from bert_lightning.training.pretrain import train
from bert_lightning.training.resume import is_stamps
from finetune_fixtures import overrides, task_files, write_tokenizer
from helpers import RESUMABLE, tiny_overrides, write_corpus

SEEN = "seen.jsonl"


class Seen(L.Callback):
    """Appends each training batch's step and digest (every tensor's bytes) to `seen.jsonl` in
    the run folder: the last line of a step is the batch it trained on (a batch begun by a run
    stopped before its step was done is logged again by the resumed run)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        digest = hashlib.sha256()
        for key in sorted(batch):
            if torch.is_tensor(value := batch[key]):
                digest.update(key.encode())
                digest.update(value.detach().cpu().contiguous().view(torch.uint8).numpy())
        with open(Path(trainer.default_root_dir) / SEEN, "a") as f:
            f.write(json.dumps([trainer.global_step, digest.hexdigest()]) + "\n")


SEE = [f"+callbacks.seen._target_={__name__}.Seen"]


def pretraining(*objective: str, chars: int | None = None):
    def run(folder: Path, wholes, *extra: str):
        write_corpus(folder / "corpus.jsonl", chars=chars)
        args = [*objective, *RESUMABLE, "data.batch_size=2", *SEE, *extra]
        return train(compose(overrides=tiny_overrides(folder, *args)))

    return run


def by_epochs(folder: Path, wholes, *extra: str):
    """MLM bound by 2 epochs, not by steps: its schedule counts the steps, so its loader is
    built before Lightning restores the checkpoint's loops. Documents of 16 characters make an
    epoch 8 steps (`EPOCH`)."""
    epochs = ("trainer.max_steps=-1", "trainer.max_epochs=2")
    return pretraining(chars=16)(folder, wholes, *epochs, *extra)


EPOCH = 8  # the steps of an epoch of `by_epochs`


def distillation(folder: Path, wholes, *extra: str):
    """A student half the teacher's width; the teacher: the whole MLM run."""
    teacher = wholes("mlm") / "checkpoints" / "last.ckpt"
    objective = [
        "objective=distill",
        f"objective.teacher={teacher}",
        *("objective.hidden=1.0", "objective.embedding=1.0", "objective.soft_mlm=1.0"),
        *("model.hidden_size=16", "model.intermediate_size=32"),
    ]
    return pretraining(*objective)(folder, wholes, *extra)


def fine_tuning(task: str, *settings: str):
    """`task` on the tiny files of finetune_fixtures, written beside the run folder (the same
    for every run: their digests are in the data record a resume checks)."""

    def run(folder: Path, wholes, *extra: str):
        files = folder.parent / "files"
        files.mkdir(exist_ok=True)
        write_tokenizer(files / "tokenizer.json")
        args = overrides(files, task, *task_files(files, task), f"paths.output_dir={folder}")
        return finetune(compose("finetune", [*args, *settings, *SEE, *extra]))

    return run


JOBS = {
    "mlm": pretraining(),
    "nsp": pretraining("data=c4_nsp"),
    "rtd": pretraining("objective=rtd"),
    "distill": distillation,
    "mlm by epochs": by_epochs,
    # trainer.max_time runs out at step 6 (a probe moves the Timer's clock): the fit validates
    # there and ends, as schedule=time_budget's runs do
    "mlm out of time": pretraining(
        *("trainer.max_time=00:00:10:00", "+callbacks.deplete._target_=probe.RunOutOfTimeAt"),
        "+callbacks.deplete.step=6",
    ),
    # 8 steps, a validation every 2 (mid-epoch), last.ckpt every 4, ranked with baselines
    "finetune steps": fine_tuning(
        "ad_relevance",
        *(
            "data.batch_size=4",
            "data.eval_batch_size=2",
            "trainer.max_steps=8",
            "trainer.max_epochs=-1",
        ),
        *("trainer.val_check_interval=2", "trainer.check_val_every_n_epoch=null"),
        *("callbacks.model_checkpoint.every_n_train_steps=4", "~callbacks.early_stopping"),
    ),
    # fine-tuning's own schedule: 38 rows in batches of 5, 8 steps an epoch, validated (5 rows
    # in batches of 4: 2 batches) at each epoch's end, early stopping on the loss
    "finetune epochs": fine_tuning(
        "seq_classification",
        *("data.batch_size=5", "data.eval_batch_size=4", "trainer.max_epochs=6"),
        *("task.monitor=loss", "task.mode=min", "callbacks.early_stopping.patience=1"),
    ),
    # the same with last.ckpt every 4 steps (crash recovery): its last save at an epoch's end
    "finetune epochs saved every 4": fine_tuning(
        "seq_classification",
        *("data.batch_size=5", "data.eval_batch_size=4", "trainer.max_epochs=6"),
        *("task.monitor=loss", "task.mode=min", "callbacks.early_stopping.patience=1"),
        "callbacks.model_checkpoint.every_n_train_steps=4",
    ),
}
PRETRAINING = ("mlm", "nsp", "rtd", "distill")


def probe(target: str, **args) -> list[str]:
    return [
        f"+callbacks.stop._target_={target}",
        *(f"+callbacks.stop.{k}={v}" for k, v in args.items()),
    ]


AT_STEP = probe("probe.SignalRank", step=1, rank=0, sig="SIGTERM")  # saved at step 2
IN_VALIDATION = probe("probe.SignalMidValidation", batch=1)  # its second batch
AT_LAST_STEP = probe("probe.SignalRank", step=7, rank=0, sig="SIGTERM")  # a validation follows
IN_LAST_VALIDATION = probe("probe.SignalMidValidation", batch=1, step=8)  # the fit's end
IN_TEST = probe("probe.SignalAtTest")
BASELINES = "baselines"  # SIGTERM as the BM25 baseline starts (a patch, not a callback)

# (job, phase): the stop, what it raises, the step last.ckpt holds (None: nothing saved; END:
# the whole run's last)
END = -1
CASES = {
    **{(job, "at a step"): (AT_STEP, Interrupted, 2) for job in PRETRAINING},
    **{(job, "in a validation"): (IN_VALIDATION, Interrupted, 4) for job in PRETRAINING},
    ("mlm", "at the last step"): (AT_LAST_STEP, Interrupted, 8),
    ("mlm", "in the last validation"): (IN_LAST_VALIDATION, Interrupted, 8),
    ("mlm", "in the data pass"): ("data pass", Interrupted, None),
    ("mlm by epochs", "at a step"): (AT_STEP, Interrupted, 2),  # mid-epoch 0
    ("mlm by epochs", "in its second epoch"): (
        probe("probe.SignalRank", step=9, rank=0, sig="SIGTERM"),
        Interrupted,
        10,
    ),
    ("mlm out of time", "in a validation"): (IN_VALIDATION, Interrupted, 4),
    # a signal during step 6, the step the time runs out at
    ("mlm out of time", "at its last step"): (
        probe("probe.SignalRank", step=5, rank=0, sig="SIGTERM"),
        Interrupted,
        6,
    ),
    ("mlm out of time", "in the last validation"): (
        probe("probe.SignalMidValidation", batch=1, step=6),
        Interrupted,
        6,
    ),
    ("finetune steps", "at a step"): (AT_STEP, Interrupted, 2),
    ("finetune steps", "in a validation"): (IN_VALIDATION, Interrupted, 2),
    ("finetune steps", "at the last step"): (AT_LAST_STEP, Interrupted, 8),
    ("finetune steps", "in the last validation"): (IN_LAST_VALIDATION, Interrupted, 8),
    ("finetune steps", "in the test"): (IN_TEST, Interrupted, END),
    ("finetune steps", "in the baselines"): (BASELINES, Interrupted, END),
    # mid-epoch 0: the resume continues that epoch's shuffle at its fourth batch
    ("finetune epochs", "at a step"): (
        probe("probe.SignalRank", step=3, rank=0, sig="SIGTERM"),
        Interrupted,
        4,
    ),
    # epoch 0's validation (2 batches), at its first: abandoned, redone at step 8
    ("finetune epochs", "in a validation"): (
        probe("probe.SignalMidValidation", batch=0),
        Interrupted,
        8,
    ),
    # its last batch: the validation is whole, the run stops after step 9
    ("finetune epochs", "in a validation's last batch"): (IN_VALIDATION, Interrupted, 9),
    # a crash in epoch 1 after epoch 0's last.ckpt: epoch 1's shuffle comes from the seed
    ("finetune epochs", "crashed in the next epoch"): (
        probe("probe.CrashAt", step=11),
        RuntimeError,
        8,
    ),
    ("finetune epochs", "in the test"): (IN_TEST, Interrupted, END),
    ("finetune epochs saved every 4", "at a step"): (AT_STEP, Interrupted, 2),
    ("finetune epochs saved every 4", "in the test"): (IN_TEST, Interrupted, END),
}


@pytest.fixture(scope="module")
def wholes(tmp_path_factory):
    """`wholes(job)`: the folder of `job`'s uninterrupted run, run once per session (under
    pytest-xdist, by whichever worker asks first; the others wait for it)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / "stop_resume_wholes"
    root.mkdir(exist_ok=True)

    def whole(job: str) -> Path:
        folder = root / job.replace(" ", "_") / "run"
        folder.parent.mkdir(exist_ok=True)
        with FileLock(str(folder.parent / "lock")):
            if not (folder.parent / "done").exists():
                JOBS[job](folder, whole)
                (folder.parent / "done").touch()
        return folder

    return whole


TIMING = ("flops_per_s", "samples_per_s", "tokens_per_s")  # the clock's, not the run's


def outcome(run: Path) -> dict:
    """What a stop and resume must not change, the run folder's path in it as `<run>`. Not the
    standalone validation loop's counters in `last.ckpt` (`validate_before_fit`'s, which only a
    fresh run does), nor the files' times in its data record (a resume does not compare them),
    nor ModelCheckpoint's `current_score` (the score of its last save by score, which Lightning
    writes and never reads nor restores: a resumed run's is None until it saves one), nor a
    Timer's elapsed times or a validation budget's seconds, nor the loaders' counts
    (`uncounted`)."""
    trained = dict(json.loads(line) for line in (run / SEEN).read_text().splitlines())
    with open(run / "metrics.csv", newline="") as f:
        rows = [{k: v for k, v in r.items() if not k.endswith(TIMING)} for r in csv.DictReader(f)]
    checkpoints = run / "checkpoints"
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=False)
    del last["loops"]["validate_loop"]
    # counts each validation begun: a stop's checkpoint records the one it abandoned as begun
    del last["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]["total"]
    for key, value in last["data_record"].items():
        if is_stamps(value):
            last["data_record"][key] = [(os.path.basename(s[0]), s[1], *s[3:]) for s in value]
    for key, state in last["callbacks"].items():
        if key.startswith("Timer"):
            del state["time_elapsed"]  # the clock's, not the run's
        if key.startswith("ValidationBudget"):  # the clock's too: the seconds validations took
            assert set(state) == {"cost", "spent", "reserved"}
            last["callbacks"][key] = {}
    kept = next(v for k, v in last["callbacks"].items() if k.startswith("ModelCheckpoint"))
    del kept["current_score"]
    best = Path(kept["best_model_path"])
    results = run / "results.json"
    return relative(
        {
            "batches": [trained[s] for s in sorted(trained)],
            "validations": [r for r in rows if any(r[k] for k in r if k.startswith("val/"))],
            "metrics.csv": rows,
            "checkpoints": sorted(p.name for p in checkpoints.iterdir()),
            "best": (
                best.name,
                kept["best_model_score"],
                torch.load(best, weights_only=True)["state_dict"],
            ),
            "last.ckpt": uncounted(last),
            "results.json": json.loads(results.read_text()) if results.exists() else None,
        },
        str(run.parent),  # the run's folder, and the task files beside it
    )


def uncounted(value):
    """`value` without torchdata's counts of what a loader's iterator handed out, in each
    loader state whose sampler keeps its own position (the epoch and the rows handed out, which
    stay compared): the counts only fast-forward a sampler that keeps none, and a run resumed
    at an epoch's end counts on from that epoch (the whole run's count from 0 again)."""
    if isinstance(value, dict):
        if isinstance(sampler := value.get("_sampler_iter_state"), dict):
            value = {
                k: v for k, v in value.items() if k not in ("_num_yielded", "_sampler_iter_yielded")
            }
            value["_sampler_iter_state"] = {
                k: v for k, v in sampler.items() if k != "samples_yielded"
            }
        return {k: uncounted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(uncounted(v) for v in value)
    return value


def relative(value, folder: str):
    """`value` with `folder` as `<folder>` in its strings (dict keys too)."""
    if isinstance(value, str):
        return value.replace(folder, "<folder>")
    if isinstance(value, dict):
        return {relative(k, folder): relative(v, folder) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(relative(v, folder) for v in value)
    return value


def differences(a, b, where: str = "") -> list[str]:
    """Where `a` and `b` differ (tensors bit for bit), as paths into them."""
    if torch.is_tensor(a) and torch.is_tensor(b):
        same = a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [where]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where} keys {sorted(a.keys() ^ b.keys(), key=str)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{where} length {len(a)} != {len(b)}"]
        return [
            d
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for d in differences(x, y, f"{where}[{i}]")
        ]
    return [] if a == b or (a != a and b != b) else [f"{where}: {a!r} != {b!r}"]


def assert_same_run(resumed: Path, whole: Path) -> None:
    a, b = outcome(whole), outcome(resumed)
    differ = [d for key in a for d in differences(a[key], b[key], key)]
    assert not differ, "the resumed run differs from the whole one at:\n" + "\n".join(differ[:30])


def stopped(job, folder, wholes, stop, monkeypatch):
    """`job` run in `folder`, stopped as `stop` says; what it raised."""
    extra = stop if isinstance(stop, list) else []
    if stop == BASELINES:
        bm25 = AdRelevance.baseline_scores

        def signalled(self, *args):
            os.kill(os.getpid(), signal.SIGTERM)
            return bm25(self, *args)

        monkeypatch.setattr(AdRelevance, "baseline_scores", signalled)
    if stop == "data pass":
        from bert_lightning.data import pipeline

        encode = pipeline.encode

        def signalled(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return encode(*args, **kwargs)

        monkeypatch.setattr(pipeline, "encode", signalled)
    try:
        JOBS[job](folder, wholes, *extra)
    except Exception as e:
        return e
    finally:
        monkeypatch.undo()
    pytest.fail("the run was not stopped")


@pytest.mark.slow
@pytest.mark.parametrize(
    "job, phase",
    list(CASES),
    ids=[f"{j}, {p}" for j, p in CASES],
)
def test_a_run_stopped_and_resumed_in_its_folder_is_the_run_never_stopped(
    job, phase, wholes, tmp_path, monkeypatch
):
    stop, raised, step = CASES[job, phase]
    whole = wholes(job)
    if job == "mlm by epochs":  # its stops fall in the epochs they name
        last = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=True)
        assert (last["global_step"], last["epoch"]) == (2 * EPOCH, 1)
    folder = tmp_path / "run"
    handlers = [signal.getsignal(s) for s in STOP_SIGNALS]
    e = stopped(job, folder, wholes, stop, monkeypatch)
    assert isinstance(e, raised), e
    assert [signal.getsignal(s) for s in STOP_SIGNALS] == handlers  # the process's own again
    last = folder / "checkpoints" / "last.ckpt"
    if isinstance(e, Interrupted):
        assert e.exit_code == 128 + signal.SIGTERM
        assert step is None or f"the same command with ckpt_path={last} " in str(e), e
    if step is None:
        resume = []
    else:
        if step == END:
            step = torch.load(whole / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
        assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == step
        resume = [f"ckpt_path={last}"]
    JOBS[job](folder, wholes, *resume)
    assert_same_run(folder, whole)
