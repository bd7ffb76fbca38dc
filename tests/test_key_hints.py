"""A misspelt key on the command line is refused in one line that names the key meant: the
nearest keys of the composed config by name, by leaf (a key under another section, as
`schedule`'s keys are the trainer's) and by a leaf's prefix or initials (`lr`)."""

import re

import pytest

from helpers import cli_error

MISSPELT = [
    ("data.mlm_prob=0.2", "data.masking.mlm_probability"),
    ("schedule.max_steps=5", "trainer.max_steps"),
    ("data.max_seq_len=64", "data.max_seq_length"),
    ("optim.learning_rate=1e-4", "optim.lr"),
    ("trainer.max_step=5", "trainer.max_steps"),
]


@pytest.mark.parametrize(("override", "meant"), MISSPELT)
def test_a_misspelt_key_names_the_key_meant(override, meant, tmp_path, capsys):
    line = cli_error(capsys, "pretrain", override, f"paths.output_dir={tmp_path}")
    key = override.split("=")[0]
    assert line.startswith(f"error: {key}: no such key; did you mean ")
    assert re.search(r"did you mean ([\w.]+)", line)[1] == meant
    assert line.endswith(f"(add it with +{key}=... if you mean a new one)")
    assert not list(tmp_path.iterdir())  # nothing ran


def test_finetune_keys_are_its_own(tmp_path, capsys):
    line = cli_error(capsys, "finetune", "task.label_col=y", f"paths.output_dir={tmp_path}")
    assert "did you mean task.label_column" in line
