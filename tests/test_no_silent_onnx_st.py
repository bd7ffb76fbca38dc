"""Issue #53, exporting a sentence-transformers folder: `bert-lightning export-onnx` pools as its
1_Pooling/config.json declares and makes unit-length vectors where it has a Normalize module, so
that `embed` and /embed of the export give the model's own vectors; another pooling asked is
refused in one line. A folder that declares nothing exports as before (mean, as it is)."""

import numpy as np
import pytest
from test_no_silent_embed import LENGTH, MEAN, TEXTS, cli_embed, encoded, served, write_st_folder

from bert_lightning.cli import main
from bert_lightning.ort import spec_of
from finetune_fixtures import write_hf_folder, write_tokenizer

pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

CLS = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def export(folder, out, *options):
    main(["export-onnx", str(folder), str(out), *options])
    return out


@pytest.mark.parametrize(
    "pooling, modules, declared, normalize",
    [(MEAN, ("Pooling", "Normalize"), "mean", True), (CLS, ("Pooling",), "cls", False)],
    ids=["mean_normalize", "cls"],
)
def test_the_export_embeds_as_the_folder_declares(
    tmp_path, tok, pooling, modules, declared, normalize
):
    folder = write_st_folder(tmp_path / "st", tok, pooling, modules)
    out = export(folder, tmp_path / "onnx")
    spec = spec_of(out)
    assert (spec["pooling"], spec["normalize"], spec["max_seq_length"]) == (
        declared, normalize, LENGTH,
    )  # fmt: skip
    want = encoded(folder, TEXTS, declared, normalize)
    got = cli_embed(out, tmp_path)
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(served(out, TEXTS) - want).max() <= 1e-4
    if normalize:
        assert np.abs(np.linalg.norm(got, axis=-1) - 1).max() <= 1e-5
    # the declared pooling asked for: the same export
    again = export(folder, tmp_path / "again", "--pooling", declared)
    assert spec_of(again) == spec


def test_another_pooling_than_the_declared_one_is_one_line(tmp_path, tok, capsys):
    folder = write_st_folder(tmp_path / "st", tok, MEAN)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        export(folder, tmp_path / "onnx", "--pooling", "cls")
    assert capsys.readouterr().err == (
        f"error: {folder / '1_Pooling' / 'config.json'}: the model pools by mean; --pooling cls "
        "would give other vectors than its own (leave --pooling out)\n"
    )
    assert not (tmp_path / "onnx").exists()


def test_a_folder_that_declares_nothing_exports_mean_as_it_is(tmp_path, tok):
    write_hf_folder(tmp_path / "hf", tok)
    spec = spec_of(export(tmp_path / "hf", tmp_path / "onnx"))
    assert (spec["pooling"], spec["normalize"]) == ("mean", False)
