"""A file someone else made is data: a checkpoint, a run folder or a model folder whose records
carry a recipe for code (a Hydra `_target_`, pickle bytes, a module name) runs nothing and is
refused in one line naming the file and the key. Each test plants a payload that, run, would
write a marker file, and checks that no marker appears."""

import inspect
import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import get_object

from bert_lightning.checkpoint import (
    OBJECTIVES,
    RECORD_TYPES,
    check_record,
    read_checkpoint,
    torch_load,
)
from bert_lightning.config import compose
from bert_lightning.errors import UserError
from bert_lightning.training.distill_module import DistillModule
from bert_lightning.training.finetune import finetune
from bert_lightning.training.finetune_module import FinetuneModule
from bert_lightning.training.pretrain import train
from bert_lightning.training.pretrain_module import BertPretrainModule
from bert_lightning.training.rtd_module import RTDPretrainModule
from finetune_fixtures import (
    overrides,
    sentiment_rows,
    write_csv,
    write_hf_folder,
    write_tokenizer,
)
from helpers import cli_error, pretrain_tiny, tiny_overrides


class _Marker:
    """Pickled, it writes its marker when unpickled (`torch.load(weights_only=False)`)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.write_text, (Path(self.path), "pickle ran"))


def payloads(marker: Path) -> list[dict]:
    """Hydra configs that write `marker` when instantiated: a method target, and
    `torch.load(weights_only=False)` over pickle bytes (what Hydra's blocklist let through)."""
    write = {
        "_target_": "pathlib.Path.write_text",
        "self": {"_target_": "pathlib.Path", "_args_": [str(marker)]},
        "data": "hydra ran",
    }
    pickled = {
        "_target_": "torch.load",
        "f": {"_target_": "io.BytesIO", "_args_": [pickle.dumps(_Marker(marker))]},
        "weights_only": False,
    }
    return [write, pickled]


def plant(src: Path, dst: Path, edit) -> Path:
    """A copy of the checkpoint `src` at `dst` with `edit(raw)` applied."""
    raw = torch.load(src, weights_only=True)
    edit(raw)
    torch.save(raw, dst)
    return dst


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A real tiny pretraining run, stopped at step 2 (a resumable last.ckpt)."""
    out = tmp_path_factory.mktemp("pretrained")
    pretrain_tiny(out, "trainer.max_steps=2")
    return out


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("finetuned")
    write_tokenizer(out / "tokenizer.json")
    train = write_csv(out / "train.csv", sentiment_rows(24))
    cfg = compose(
        "finetune",
        overrides(out, "seq_classification", f"task.train_file={train}", "trainer.max_steps=2"),
    )
    finetune(cfg)
    return out


def one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("kind", ["method", "pickle"])
def test_evaluate_runs_nothing_a_checkpoint_data_record_names(pretrained, tmp_path, capsys, kind):
    marker = tmp_path / "marker"
    payload = payloads(marker)[kind == "pickle"]
    ckpt = plant(
        pretrained / "checkpoints" / "last.ckpt",
        tmp_path / "crafted.ckpt",
        lambda raw: raw["data_record"]["data.masking"].update(x=payload),
    )
    line = cli_error(capsys, "evaluate", ckpt, pretrained / "corpus.jsonl")
    assert not marker.exists()
    assert line == (
        f"error: {ckpt}: data_record.data.masking.x._target_: a key bert_lightning does "
        "not write (a checkpoint's record is data: nothing in it names code to run)"
    )


def test_evaluate_refuses_a_data_record_that_names_no_data_module(pretrained, tmp_path, capsys):
    """Settings without the module they belong to (an NSP run's pairing) are not framed by
    another module: one line, no traceback."""
    ckpt = plant(
        pretrained / "checkpoints" / "last.ckpt",
        tmp_path / "crafted.ckpt",
        lambda raw: (
            raw["data_record"].pop("data._target_")
            and raw["data_record"].update({"data.short_seq_prob": 0.1, "data.dupe_factor": 2})
        ),
    )
    line = cli_error(capsys, "evaluate", ckpt, pretrained / "corpus.jsonl")
    assert line == f"error: {ckpt}: data_record has no data._target_ (the data module it records)"


def test_evaluate_imports_no_module_a_checkpoint_names(pretrained, tmp_path, capsys):
    """A `_target_` of the record is compared with the package's own data modules, never
    imported: a module planted on the path that writes a marker on import stays unimported."""
    marker = tmp_path / "marker"
    (tmp_path / "planted_module.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nclass X: ...\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        ckpt = plant(
            pretrained / "checkpoints" / "last.ckpt",
            tmp_path / "crafted.ckpt",
            lambda raw: raw["data_record"].update({"data._target_": "planted_module.X"}),
        )
        line = cli_error(capsys, "evaluate", ckpt, pretrained / "corpus.jsonl")
        assert not marker.exists()
        assert line.startswith(
            f"error: {ckpt}: data_record data._target_='planted_module.X': not a data "
            "module of bert_lightning (bert_lightning.data.pretraining.PretrainDataModule, "
        )
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("planted_module", None)


def test_a_pretraining_resume_runs_nothing_its_optim_record_names(pretrained, tmp_path):
    marker = tmp_path / "marker"

    def edit(raw):
        raw["hyper_parameters"]["optim"] |= {"_target_": "builtins.dict", "lr": payloads(marker)[0]}

    ckpt = plant(pretrained / "checkpoints" / "last.ckpt", tmp_path / "crafted.ckpt", edit)
    cfg = compose(overrides=tiny_overrides(pretrained, "trainer.max_steps=4", f"ckpt_path={ckpt}"))
    with pytest.raises(UserError) as e:
        train(cfg)
    assert not marker.exists()
    assert one_line(e) == (
        f"{ckpt}: hyper_parameters.optim.lr._target_: a key bert_lightning does not write (a "
        "checkpoint's record is data: nothing in it names code to run)"
    )


def test_a_resume_keeps_its_config_optimizer_whatever_the_record_names(pretrained, tmp_path):
    """A record's `_target_` (of the right type) is not copied: the run's config builds."""

    def edit(raw):
        raw["hyper_parameters"]["optim"]["_target_"] = "bert_lightning_marker.write"

    ckpt = plant(pretrained / "checkpoints" / "last.ckpt", tmp_path / "crafted.ckpt", edit)
    out = tmp_path / "resumed"
    (out).mkdir()
    (out / "corpus.jsonl").write_bytes((pretrained / "corpus.jsonl").read_bytes())
    cfg = compose(overrides=tiny_overrides(out, "trainer.max_steps=3", f"ckpt_path={ckpt}"))
    train(cfg)
    last = torch_load(out / "checkpoints" / "last.ckpt")
    assert last["global_step"] == 3
    assert last["hyper_parameters"]["optim"]["_target_"] == "bert_lightning.training.optim.adamw"


def test_a_finetuning_resume_runs_nothing_its_optim_record_names(finetuned, tmp_path):
    marker = tmp_path / "marker"

    def edit(raw):
        raw["hyper_parameters"]["optim"] |= {"_target_": "builtins.dict", "lr": payloads(marker)[1]}

    ckpt = plant(finetuned / "run" / "checkpoints" / "last.ckpt", tmp_path / "crafted.ckpt", edit)
    train = finetuned / "train.csv"
    cfg = compose(
        "finetune",
        overrides(finetuned, "seq_classification", f"task.train_file={train}", f"ckpt_path={ckpt}"),
    )
    with pytest.raises(UserError) as e:
        finetune(cfg)
    assert not marker.exists()
    assert one_line(e).startswith(f"{ckpt}: hyper_parameters.optim.lr._target_: a key")


@pytest.mark.parametrize(
    "edit, key",
    [
        (lambda h: h.update(callbacks={"_target_": "os.system"}), "hyper_parameters.callbacks"),
        (lambda h: h["config"].update(hidden_size={"_target_": "os.getcwd"}), "config"),
        (lambda h: h.update(nsp="yes"), "hyper_parameters.nsp"),
        (lambda h: h["optim"].update(betas=[{"_args_": [1]}, 0.9]), "optim.betas[0]._args_"),
        (lambda h: h.update(objective="os.system"), "hyper_parameters.objective='os.system'"),
    ],
)
def test_any_reader_refuses_a_record_with_keys_or_values_a_run_never_writes(
    pretrained, tmp_path, edit, key
):
    ckpt = plant(
        pretrained / "checkpoints" / "last.ckpt",
        tmp_path / "crafted.ckpt",
        lambda raw: edit(raw["hyper_parameters"]),
    )
    with pytest.raises(UserError) as e:
        read_checkpoint(ckpt)
    assert one_line(e).startswith(f"{ckpt}: ") and key in str(e.value)


def test_a_data_record_of_objects_is_refused(pretrained, tmp_path):
    ckpt = plant(
        pretrained / "checkpoints" / "last.ckpt",
        tmp_path / "crafted.ckpt",
        lambda raw: raw["data_record"].update(x={"_target_": "os.system"}),
    )
    cfg = compose(overrides=tiny_overrides(pretrained, "trainer.max_steps=4", f"ckpt_path={ckpt}"))
    with pytest.raises(UserError, match=r"data_record\.x\._target_: a key bert_lightning"):
        train(cfg)


@pytest.mark.parametrize("where", ["checkpoint", "folder"])
def test_a_model_beyond_the_machine_is_refused_before_allocation(tmp_path, capsys, where):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    folder = tmp_path / "hf"
    write_hf_folder(folder, tok)
    config = json.loads((folder / "config.json").read_text()) | {"num_hidden_layers": 10**7}
    if where == "folder":
        (folder / "config.json").write_text(json.dumps(config))
        model = folder
    else:
        model = tmp_path / "huge.ckpt"
        config.pop("model_type")
        torch.save(
            {"hyper_parameters": {"config": config}, "state_dict": {"x": torch.zeros(1)},
             "tokenizer": tok.to_str()},
            model,
        )  # fmt: skip
    texts = tmp_path / "texts.txt"
    texts.write_text("a good movie\n")
    line = cli_error(capsys, "embed", model, texts, tmp_path / "out.npy")
    assert "exceeds this machine's memory" in line and "num_hidden_layers" not in line
    assert line.startswith(f"error: {model}")


def test_a_hf_config_of_objects_is_refused(tmp_path, capsys):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    folder = tmp_path / "hf"
    write_hf_folder(folder, tok)
    marker = tmp_path / "marker"
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"hidden_size": payloads(marker)[0]}))
    texts = tmp_path / "texts.txt"
    texts.write_text("a good movie\n")
    line = cli_error(capsys, "embed", folder, texts, tmp_path / "out.npy")
    assert not marker.exists()
    assert line.startswith(f"error: {folder / 'config.json'}.hidden_size: expected int")


def test_pickle_bytes_in_a_record_stay_bytes(pretrained, tmp_path):
    """torch's weights-only reader refuses objects; bytes are read as bytes, never unpickled."""
    marker = tmp_path / "marker"
    blob = pickle.dumps(_Marker(marker))
    ckpt = plant(
        pretrained / "checkpoints" / "last.ckpt",
        tmp_path / "crafted.ckpt",
        lambda raw: raw.update(blob=blob),
    )
    read_checkpoint(ckpt)  # an extra top-level entry of bytes: not a record, not read
    assert not marker.exists()


@pytest.mark.parametrize(
    "module", [BertPretrainModule, RTDPretrainModule, DistillModule, FinetuneModule]
)
def test_every_hyper_parameter_a_module_records_is_in_the_record_schema(module):
    recorded = set(inspect.signature(module.__init__).parameters)
    recorded -= {"self", "tokenizer_json", "teacher_ckpt", "data_record"}  # its own record
    assert recorded <= set(RECORD_TYPES)


def test_a_pretraining_checkpoint_names_its_objective(pretrained):
    """The objective a checkpoint was trained with is recorded by name (its module's, as
    conf/objective/ names them), the one answer every reader takes, not inferred from which
    other settings it records."""
    raw = torch_load(pretrained / "checkpoints" / "last.ckpt")
    assert raw["hyper_parameters"]["objective"] == "mlm"
    for name in OBJECTIVES:
        path = Path(__file__).parents[1] / "conf" / "objective" / f"{name}.yaml"
        assert name == get_object(yaml.safe_load(path.read_text())["_target_"]).OBJECTIVE


@pytest.fixture
def hf_folder(tmp_path):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    folder = tmp_path / "hf"
    write_hf_folder(folder, tok)
    (tmp_path / "texts.txt").write_text("a good movie\n")
    return folder


def embed_error(capsys, model, tmp_path) -> str:
    return cli_error(capsys, "embed", model, tmp_path / "texts.txt", tmp_path / "out.npy")


def test_a_tokenizer_config_of_objects_is_refused(hf_folder, tmp_path, capsys):
    marker = tmp_path / "marker"
    path = hf_folder / "tokenizer_config.json"
    path.write_text(json.dumps({"do_lower_case": payloads(marker)[0]}))
    line = embed_error(capsys, hf_folder, tmp_path)
    assert not marker.exists()
    assert line.startswith(f"error: {path}.do_lower_case: expected bool, got {{'_target_'")


def test_a_sentence_transformers_module_outside_its_folder_is_refused(hf_folder, tmp_path, capsys):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    modules = [{"type": "sentence_transformers.models.Pooling", "path": "../elsewhere"}]
    (hf_folder / "modules.json").write_text(json.dumps(modules))
    line = embed_error(capsys, hf_folder, tmp_path)
    assert line == (
        f"error: {hf_folder / 'modules.json'}: the Pooling module's path '../elsewhere' leaves "
        f"{hf_folder}"
    )


def test_an_onnx_spec_with_keys_export_never_writes_is_refused(hf_folder, tmp_path, capsys):
    folder = tmp_path / "onnx"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    spec = {"use": "embed", "pooling": "cls", "max_seq_length": 32, "_target_": "os.system"}
    (folder / "onnx.json").write_text(json.dumps(spec))
    assert "unknown key(s) ['_target_']" in embed_error(capsys, folder, tmp_path)
    del spec["_target_"]
    (folder / "onnx.json").write_text(json.dumps({**spec, "max_seq_length": {"_target_": "x"}}))
    line = embed_error(capsys, folder, tmp_path)
    assert line.startswith(f"error: {folder / 'onnx.json'}.max_seq_length: expected int")


def test_interpolate_reads_a_run_config_without_resolving_it(finetuned, tmp_path, capsys):
    """A `${oc.env:...}` planted in a downloaded run's config_resolved.yaml is text: no
    environment variable (a secret) is read into what the command does or prints."""
    run = tmp_path / "run"
    shutil.copytree(finetuned / "run", run)
    path = run / "config_resolved.yaml"
    cfg = yaml.safe_load(path.read_text())
    cfg["task"]["train_file"] = "${oc.env:BERT_LIGHTNING_SECRET}"
    path.write_text(yaml.safe_dump(cfg))
    os.environ["BERT_LIGHTNING_SECRET"] = "s3cret"
    try:
        last = run / "checkpoints" / "last.ckpt"
        line = cli_error(capsys, "interpolate", last, tmp_path / "o.ckpt", "--start", last)
    finally:
        del os.environ["BERT_LIGHTNING_SECRET"]
    assert "s3cret" not in line and "${oc.env:BERT_LIGHTNING_SECRET}" in line


def test_a_resume_deletes_nothing_outside_its_checkpoints_folder(pretrained, tmp_path):
    """The checkpoint callback's state names the files a resume may replace or delete: one
    outside its folder (`..`) is refused before anything runs."""
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    run = tmp_path / "run"
    shutil.copytree(pretrained, run)
    ckpt = run / "checkpoints" / "last.ckpt"

    def edit(raw):
        (key,) = [k for k in raw["callbacks"] if k.startswith("ModelCheckpoint")]
        folder = str(run / "checkpoints")
        raw["callbacks"][key] |= {"dirpath": folder, "last_model_path": f"{folder}/../../victim"}

    plant(ckpt, ckpt, edit)
    cfg = compose(overrides=tiny_overrides(run, "trainer.max_steps=4", f"ckpt_path={ckpt}"))
    with pytest.raises(UserError) as e:
        train(cfg)
    assert (victim / "keep.txt").read_text() == "mine"
    assert one_line(e).startswith(f"{ckpt}: callbacks.ModelCheckpoint")
    assert "not a file of its folder" in str(e.value)


def test_a_run_folder_config_is_read_without_resolvers(tmp_path):
    """Which entry point wrote a run folder is read from its config_resolved.yaml as plain
    YAML: a `${package_dir:...}` planted there imports nothing."""
    import bert_lightning.config  # noqa: F401  (registers the project's resolvers)
    from bert_lightning.run_folder import RESOLVED, entry_point

    marker = tmp_path / "marker"
    package = tmp_path / "planted_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    (tmp_path / RESOLVED).write_text("task: ${package_dir:planted_pkg.sub}\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert entry_point(tmp_path) == "finetune"
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("planted_pkg", None)
    assert not marker.exists()


def test_a_config_declaring_shapes_its_weights_lack_is_refused_unbuilt(hf_folder, tmp_path, capsys):
    config = json.loads((hf_folder / "config.json").read_text())
    config |= {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16}
    (hf_folder / "config.json").write_text(json.dumps(config))
    line = embed_error(capsys, hf_folder, tmp_path)
    held = "bert.embeddings.LayerNorm.bias holds (32,)"
    assert line == f"error: {hf_folder}: {held}, its config declares (1024,)"
    config |= {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2}
    config |= {"num_hidden_layers": 40}
    (hf_folder / "config.json").write_text(json.dumps(config))
    line = embed_error(capsys, hf_folder, tmp_path)
    assert line == f"error: {hf_folder}: declares num_hidden_layers=40; its weights hold 2 layers"


def test_a_moved_runs_rebased_paths_stay_in_its_folder(pretrained, tmp_path):
    """A path that normalises into the recorded folder but is written with `..` would, rebased
    onto the folder a moved run continues in, leave it: refused as it is written."""
    old = str(tmp_path / "victim")

    def edit(raw):
        (key,) = [k for k in raw["callbacks"] if k.startswith("ModelCheckpoint")]
        escape = old + "/.." * 12 + old + "/important"  # normalises to old/important
        raw["callbacks"][key] |= {"dirpath": old, "last_model_path": escape}

    ckpt = plant(pretrained / "checkpoints" / "last.ckpt", tmp_path / "crafted.ckpt", edit)
    with pytest.raises(UserError, match="not a file of its folder"):
        read_checkpoint(ckpt)


def test_weights_stored_as_a_broadcast_view_are_refused(pretrained, tmp_path):
    """A tensor of the declared shape over one stored float (stride 0): a 100 KB file would
    build a model of any size the machine holds."""
    key = "model.bert.embeddings.word_embeddings.weight"

    def edit(raw):
        raw["state_dict"][key] = torch.zeros(1).expand(*raw["state_dict"][key].shape)

    ckpt = plant(pretrained / "checkpoints" / "last.ckpt", tmp_path / "crafted.ckpt", edit)
    with pytest.raises(UserError) as e:
        read_checkpoint(ckpt)
    assert one_line(e).startswith(f"{ckpt}: bert.embeddings.word_embeddings.weight holds (")
    assert str(e.value).endswith(" in 4 bytes (a broadcast view): weights are stored whole")


def test_an_onnx_graph_of_operators_export_never_writes_is_refused(hf_folder, tmp_path, capsys):
    """A graph is a program: a `Loop` of 10^12 turns ran past 10 minutes and no signal
    stopped it. Only `export-onnx`'s operators are run."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto as T
    from onnx import helper as h

    folder = tmp_path / "onnx"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((hf_folder / "tokenizer.json").read_bytes())
    spec = {"use": "embed", "pooling": "cls", "normalize": False, "output": "embeddings"}
    (folder / "onnx.json").write_text(json.dumps(spec | {"max_seq_length": 32, "width": 32}))
    scalar = lambda name, t: h.make_tensor_value_info(name, t, [])  # noqa: E731
    body = h.make_graph(
        [h.make_node("Identity", ["c"], ["c2"]), h.make_node("Identity", ["a"], ["a2"])],
        "body",
        [scalar("i", T.INT64), scalar("c", T.BOOL), scalar("a", T.FLOAT)],
        [scalar("c2", T.BOOL), scalar("a2", T.FLOAT)],
    )
    graph = h.make_graph(
        [h.make_node("Loop", ["n", "cond", "a0"], ["embeddings"], body=body)],
        "g",
        [h.make_tensor_value_info("input_ids", T.INT64, ["B", "T"])],
        [scalar("embeddings", T.FLOAT)],
        initializer=[
            h.make_tensor("n", T.INT64, [], [10**12]),
            h.make_tensor("cond", T.BOOL, [], [True]),
            h.make_tensor("a0", T.FLOAT, [], [0.0]),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    onnx.save(model, folder / "model.onnx")
    line = embed_error(capsys, folder, tmp_path)
    assert line == (
        f"error: {folder / 'model.onnx'}: operator ai.onnx.Loop: not one that export-onnx writes "
        "(an exported folder is data: its graph runs as it is)"
    )


@pytest.mark.parametrize(
    "key, state, message",
    [
        ("Timer", {"time_elapsed": {"train": -1e12}}, "Timer.time_elapsed.train=-1000000000000.0;"),
        ("Timer", {"time_elapsed": {"train": float("inf")}}, "time_elapsed.train=inf;"),
        ("Timer", {"time_elapsed": {"validate": float("nan")}}, "time_elapsed.validate=nan;"),
        ("EarlyStopping{'monitor': 'val/loss'}", {"wait_count": -5}, "wait_count=-5"),
        ("EarlyStopping{'monitor': 'val/loss'}", {"stopped_epoch": float("nan")}, "epoch=nan"),
        ("EarlyStopping{'monitor': 'val/loss'}", {"best_score": "low"}, "best_score='low'"),
        ("SaveOnInterrupt", {"save_waits": "yes"}, "save_waits true or false"),
        ("ValidationBudget", {"reserved": -1e9}, "ValidationBudget.reserved=-1000000000.0;"),
        ("ValidationBudget", {"spent": float("nan")}, "ValidationBudget.spent=nan;"),
        ("ValidationBudget", {"cost": "1 s"}, "ValidationBudget.cost='1 s';"),
    ],
)
def test_resumed_callback_counts_are_finite_numbers(key, state, message):
    """A crafted Timer (a negative elapsed time: a time-budget run that never ends, at rate
    0) or EarlyStopping state is refused before a resume applies it."""
    with pytest.raises(UserError, match="expected (a finite number|one number|save_waits)") as e:
        check_record({"callbacks": {key: state}}, "crafted.ckpt")
    assert message in str(e.value)


def test_a_timer_stopped_inside_a_validation_reads_back():
    """Lightning's Timer records a stage begun and not ended as a negative time (its last end
    before its start): a stop inside a validation of a `trainer.max_time` run writes one, and
    its resume reads it (the Timer restores training's time alone)."""
    timer = {"time_elapsed": {"train": 3.0, "validate": -0.196, "test": 0.0}}
    check_record({"callbacks": {"Timer": timer}}, "stopped.ckpt")
