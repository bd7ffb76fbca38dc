"""A misspelt config key is an error that names it (never a silent default), and the
defaults-list order (`_self_` first) still lets groups, experiments and the command line
override what the root config says."""

import pytest
from hydra.utils import instantiate

from bert_lightning.config import compose
from bert_lightning.tasks.kinds import make_task
from bert_lightning.training.finetune import finetune
from conftest import tiny_overrides, write_corpus


def test_a_misspelt_masking_or_tokenizer_key_fails_naming_it(tmp_path):
    write_corpus(tmp_path / "corpus.jsonl", 10)
    for key, name in [
        ("+data.masking.mlm_probabilty=0.2", "mlm_probabilty"),
        ("+data.tokenizer.vocab_sise=100", "vocab_sise"),
    ]:
        cfg = compose(overrides=tiny_overrides(tmp_path, key))
        with pytest.raises(Exception, match=name):
            instantiate(cfg.data, out_dir=None, given_tokenizer=None)
    cfg = compose(overrides=tiny_overrides(tmp_path, "+model.hiden_size=8"))
    with pytest.raises(Exception, match="hiden_size"):
        instantiate(cfg.model)


def test_a_misspelt_task_key_fails_naming_it(tmp_path):
    cfg = compose(
        "finetune",
        [f"paths.output_dir={tmp_path}", "task.train_file=x.csv", "+task.lable_column=x"],
    )
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['lable_column'\]"):
        finetune(cfg)
    for kind in ("seq_classification", "regression", "ad_relevance", "token_classification"):
        task = compose("finetune", [f"task={kind}", "task.train_file=x"]).task
        make_task(dict(task))  # every key of the shipped task configs is known


def test_groups_experiments_and_overrides_beat_the_root_config(tmp_path):
    ft = compose("finetune", [f"paths.output_dir={tmp_path}"])
    assert ft.trainer.max_epochs == 3 and ft.trainer.max_steps == -1  # schedule=finetune
    assert "early_stopping" in ft.callbacks and ft.ckpt_path is None
    ft = compose("finetune", [f"paths.log_dir={tmp_path}", "experiment=brackets_grammar"])
    assert ft.trainer.max_steps == 300 and ft.max_seq_length == 18 and ft.optim.lr == 2e-3
    assert ft.callbacks.early_stopping.patience == 4 and ft.model.hidden_size == 32
    ft = compose("finetune", ["experiment=brackets_grammar", "max_seq_length=20"])
    assert ft.max_seq_length == 20
    tr = compose(overrides=["experiment=brackets", "seed=7", "trainer.max_steps=5"])
    assert tr.seed == 7 and tr.trainer.max_steps == 5 and tr.model.hidden_dropout_prob == 0.0
    assert tr.optim.lr == 6e-3 and tr.data.seed == 7
    assert compose(overrides=["model=bert_base"]).model.layer_norm_eps == 1e-12  # shared once
