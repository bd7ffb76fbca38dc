"""One word per concept (#55): the keys renamed in this release (`data.objective` ->
`data.nsp`, fine-tuning's `distill.*` -> `soft_labels.*`) still work for one release, given on
the command line or in a user's config, with one warning naming the new key; checkpoints
written before the rename resume, evaluate and fine-tune; the old words are gone from the
package where they named the other concept."""

import re
import sys
from pathlib import Path

import pytest
import torch

from bert_lightning.checkpoint import Checkpoint, read_checkpoint
from bert_lightning.config import compose, hydra_main
from bert_lightning.errors import UserError
from bert_lightning.shipped import CONFIG_DIR
from helpers import PACKAGE, pretrain_tiny, tiny_overrides

WARNING = "{} is deprecated (removed in the next release); use {}"


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]


def test_an_old_key_on_the_command_line_sets_its_new_one_with_one_warning(caplog):
    cfg = compose("train", ["paths.output_dir=.", "data=c4_nsp", "data.objective=mlm"])
    assert cfg.data.nsp is False and "objective" not in cfg.data
    assert warnings_of(caplog) == [WARNING.format("data.objective", "data.nsp")]
    caplog.clear()
    old = ["distill.teacher=${pretrained}", "distill.weight=0.3", "pretrained=x"]
    cfg = compose("finetune", ["paths.output_dir=.", *old])
    assert "distill" not in cfg
    assert dict(cfg.soft_labels) == {"encoder": "x", "weight": 0.3}
    assert warnings_of(caplog) == [
        WARNING.format("distill.teacher", "soft_labels.encoder"),
        WARNING.format("distill.weight", "soft_labels.weight"),
    ]
    with pytest.raises(UserError, match="data.objective: its new key data.nsp is not one of"):
        compose("train", ["paths.output_dir=.", "data=c4_sample", "data.objective=mlm"])


def test_an_old_key_in_a_users_experiment_and_on_the_entrys_command_line(tmp_path, monkeypatch):
    """Through `hydra_main`, as train.py runs: the experiment's key and the command line's are
    one key of the composed config, warned about once, in the job's log."""
    (tmp_path / "conf/experiment").mkdir(parents=True)
    (tmp_path / "conf/experiment/mine.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /data: c4_nsp\ndata:\n  objective: mlm\n"
    )
    argv = [f"hydra.searchpath=[file://{tmp_path}/conf]", "experiment=mine"]
    argv += [f"paths.output_dir={tmp_path}/run", "data.objective=mlm_nsp"]
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    seen = []
    hydra_main("train")(lambda cfg: seen.append(cfg.data))(job="renamed")
    assert seen[0].nsp is True and "objective" not in seen[0]
    log = (tmp_path / "run/renamed.log").read_text()
    assert log.count("deprecated") == 1
    assert WARNING.format("data.objective", "data.nsp") in log


def written_before_the_rename(path: Path) -> None:
    """`path` as the code before the rename wrote it: the module's `objective` argument, its
    `data` settings' and its data record's `data.objective`."""
    raw = torch.load(path, weights_only=True)
    hparams = raw["hyper_parameters"]
    nsp = {True: "mlm_nsp", False: "mlm"}[hparams.pop("nsp")]
    hparams["objective"] = nsp
    hparams["data"]["objective"] = nsp
    del hparams["data"]["nsp"]
    raw["data_record"] = {
        ("data.objective" if k == "data.nsp" else k): nsp if k == "data.nsp" else v
        for k, v in raw["data_record"].items()
    }
    torch.save(raw, path)


@pytest.mark.slow
def test_a_checkpoint_of_the_old_keys_evaluates_resumes_and_finetunes(tmp_path):
    from bert_lightning.commands.evaluate import evaluate_mlm
    from bert_lightning.training.finetune import finetune
    from bert_lightning.training.pretrain import train
    from finetune_fixtures import task_files

    pretrain_tiny(tmp_path, "data=c4_nsp")
    last = tmp_path / "checkpoints/last.ckpt"
    written_before_the_rename(last)
    assert "nsp_acc" in evaluate_mlm(last, [str(tmp_path / "corpus.jsonl")])  # NSP pairs
    resume = tiny_overrides(tmp_path, "data=c4_nsp", f"ckpt_path={last}", "trainer.max_steps=8")
    with pytest.raises(UserError, match="trained on other data: data.nsp True -> False;"):
        train(compose(overrides=[*resume, "data.nsp=false"]))  # a real change
    train(compose(overrides=resume))
    assert read_checkpoint(last).step == 8
    (tmp_path / "ft").mkdir()
    files = task_files(tmp_path / "ft", "seq_classification")
    run = [f"paths.output_dir={tmp_path / 'ft/run'}", f"pretrained={last}", "trainer.max_steps=2"]
    assert finetune(compose("finetune", ["debug=tiny", "task=seq_classification", *files, *run]))


OLD_WORDS = re.compile(
    r"data\.objective|distill\.(teacher|weight)|mlm_nsp|run_kind|check_kind|RunKind"
)


def test_the_old_words_are_gone_where_they_named_the_other_concept():
    from bert_lightning import run_folder
    from bert_lightning.data.brackets import BracketsDataModule
    from bert_lightning.data.nsp import NSPDataModule
    from bert_lightning.data.pretraining import BertDataModule
    from bert_lightning.tasks.kinds import TASKS

    found = [
        f"{path.relative_to(PACKAGE)}:{n}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "renamed.py"  # the deprecation map
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if OLD_WORDS.search(line)
    ]
    assert found == []
    assert not any(hasattr(m, "objective") for m in (BertDataModule, NSPDataModule))
    assert not hasattr(BracketsDataModule, "objective")
    assert not hasattr(Checkpoint, "kind") and not hasattr(run_folder, "run_kind")
    for task in TASKS.values():
        assert not {"fit", "prepare", "distilled"} & set(dir(task)), task
    data = "".join(p.read_text() for p in CONFIG_DIR.glob("data/*.yaml"))
    assert not re.search(r"^objective:", data, re.M)
    assert not re.search(r"^distill:", (CONFIG_DIR / "finetune.yaml").read_text(), re.M)
