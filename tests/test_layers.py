"""The layout is the architecture: a module names only modules of its own layer or the layers
below it, so a reader follows a batch from a C4 line to the loss without jumping back and forth.
There is no exception list.

- Code names a module by an import, absolute or relative (resolved against the importing
  module), and by a string that is a dotted path into the package: `import_module`'s argument,
  a `_target_` (an f-string by its constant head: `f"bert_lightning.commands.{name}"` names
  `commands`).
- A config names what its strings name, from the layer of the code that instantiates its
  group: `conf/data/` (or the `data` key of a `_global_` file, such as an experiment) the data
  layer or below, `conf/model/` the model layer, `conf/task/` the tasks layer, any other group
  (trainer, callbacks, logger, optim, hydra) the training layer.
- The bottom layer imports the standard library alone."""

import ast
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bert_lightning.config import CONFIG_DIR
from helpers import PACKAGE

LAYERS = {  # module path -> layer, lowest first; the longest matching prefix wins
    "atomic": 0,  # standard-library helpers every layer uses
    "errors": 0,
    "signals": 0,
    "fields": 0,
    "fingerprints": 0,
    "model": 1,
    "choices": 1,  # the command line's vocabularies and defaults, light enough for --help
    "shipped": 1,  # the package's files: the config tree (read without Hydra), the assets
    "run_folder": 1,  # where a run writes and how it is found again, for training and Hydra
    "progress": 1,  # progress lines of the steps before training (tqdm), for data and up
    "private_api": 1,  # the libraries' private names, for every layer that reads one
    "data": 2,
    "checkpoint": 3,
    "interop": 3,
    "weights": 3,  # what a run does to the weights it starts from (a Checkpoint in, one out)
    "tasks": 4,
    "inference": 5,  # loading a model and the batched loop of each use
    "ort": 5,  # an exported model run by ONNX Runtime, as inference loads it
    "onnx_export": 5,  # a model as it is used, written as an ONNX folder
    "catalogue": 5,  # a catalogue's ads encoded once, as inference encodes them
    "training": 6,
    "config": 7,
    "commands": 7,
    "serving": 7,
    "experiments": 7,
    "cli": 7,
    "__main__": 7,
    "__init__": 7,
}
GROUP_LIMIT = {"data": "data", "model": "model", "task": "tasks"}  # other groups: training
DOTTED = re.compile(r"(?<![\w.])bert_lightning(?:\.\w+)+")


def layer(name: str) -> int:
    """The layer of module path `name` (`training.finetune_module`: training's)."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise AssertionError(f"bert_lightning.{name}: no layer; add it to LAYERS")


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def in_package(dotted: str) -> str | None:
    """`bert_lightning.x.y` -> `x.y`; the package itself -> `__init__`; None outside it."""
    if dotted == "bert_lightning":
        return "__init__"
    return dotted.removeprefix("bert_lightning.") if dotted.startswith("bert_lightning.") else None


def named(name: str, source: str) -> Iterator[str]:
    """The package's modules (or names in them) that module `name`, of `source`, names."""
    package = name.split(".")[:-1]  # what `.` means in it (a package's `__init__` too)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from filter(None, (in_package(a.name) for a in node.names))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level <= len(package) + 1, f"{name}: `{'.' * node.level}` is outside"
                base = ["bert_lightning", *package[: len(package) + 1 - node.level]]
                module = in_package(".".join(base + [node.module] * bool(node.module)))
            else:
                module = in_package(node.module)
            if module == "__init__":  # `from bert_lightning import x`: a module, or the package's
                yield from (a.name if a.name in LAYERS else "__init__" for a in node.names)
            elif module:
                yield from (f"{module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if DOTTED.fullmatch(node.value):
                yield in_package(node.value)
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and DOTTED.fullmatch(head.value.rstrip(".")):
                yield in_package(head.value.rstrip("."))


def upward(name: str, source: str) -> list[str]:
    return [f"{name} -> {t}" for t in named(name, source) if layer(t) > layer(name)]


def outside(source: str) -> list[str]:
    """The packages other than the standard library and ours that `source` imports."""
    tops = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            tops.add(node.module.split(".")[0])
    return sorted(tops - sys.stdlib_module_names - {"bert_lightning"})


def strings(node, keys=()) -> Iterator[tuple[tuple, str]]:
    """(the keys leading to it, value) of every string in a parsed YAML document."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, (*keys, str(k)))
    elif isinstance(node, list):
        for v in node:
            yield from strings(v, keys)
    elif isinstance(node, str):
        yield keys, node


def config_upward(rel: Path, text: str) -> list[str]:
    """The strings of config `rel` (relative to the config folder) that name a module above
    the layer of its group's instantiating code."""
    package = re.search(r"^#\s*@package\s+(\S+)", text, re.MULTILINE)
    folder = rel.parts[0] if len(rel.parts) > 1 else "_global_"
    group = package.group(1) if package else folder
    out = []
    for keys, value in strings(yaml.safe_load(text)):
        g = (keys[0] if keys else "") if group == "_global_" else group.split(".")[0]
        limit = LAYERS[GROUP_LIMIT.get(g, "training")]
        for m in DOTTED.finditer(value):
            if layer(in_package(m.group())) > limit:
                out.append(f"{rel}: {'.'.join(keys)}={m.group()}")
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))
CONFIGS = sorted(p for p in CONFIG_DIR.rglob("*") if p.suffix in (".yaml", ".yml"))


def test_every_module_and_config_is_seen():
    assert len(MODULES) > 50 and len(CONFIGS) > 30, (len(MODULES), len(CONFIGS))
    for path in MODULES:
        layer(module_name(path))  # raises for a module of no layer
    for prefix in LAYERS:  # no stale entry
        assert (PACKAGE / f"{prefix}.py").is_file() or (PACKAGE / prefix).is_dir(), prefix


def test_no_module_imports_from_a_layer_above_it():
    found = [e for p in MODULES for e in upward(module_name(p), p.read_text())]
    assert not found, found


def test_the_bottom_layer_needs_only_the_standard_library():
    bottom = {module_name(p): outside(p.read_text()) for p in MODULES if not layer(module_name(p))}
    names = ["atomic", "errors", "fields", "fingerprints", "signals"]
    assert sorted(bottom) == names and not any(bottom.values()), bottom
    assert outside("import json\nfrom hydra.utils import get_object") == ["hydra"]


MODEL_USERS = ("inference", "serving", "commands.score", "commands.embed", "commands.fill_mask")


def test_using_a_model_needs_no_training_layer():
    """Scoring, embedding, filling masks and serving load a model without Lightning: none of
    them imports the training layer (nor Lightning itself)."""
    for name in MODEL_USERS:
        source = (PACKAGE / f"{name.replace('.', '/')}.py").read_text()
        assert not [t for t in named(name, source) if t.startswith("training")], name
        assert "lightning" not in outside(source), name


@pytest.mark.slow
def test_using_a_model_imports_no_lightning_through_what_it_imports():
    """The layer test reads each module's own imports; a LightningDataModule in the tasks layer,
    say, comes in through another module's: the modules imported in a fresh interpreter. Nor
    torchmetrics or scipy (seconds of a server's or `score`'s start): what only a fit, a test
    report or a baseline uses is imported where it is used."""
    imports = "; ".join(f"import bert_lightning.{n}" for n in MODEL_USERS)
    heavy = ("lightning", "torchmetrics", "scipy")
    probe = f"import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy}))"
    out = subprocess.run(
        [sys.executable, "-c", f"{imports}; {probe}"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_no_config_targets_a_layer_above_its_group():
    found = [e for p in CONFIGS for e in config_upward(p.relative_to(CONFIG_DIR), p.read_text())]
    assert not found, found


@pytest.mark.parametrize(
    "name, source",
    [
        ("inference", "from bert_lightning.training.finetune_module import FinetuneModule"),
        ("data.pretraining", "from ..tasks import kinds"),
        ("data.pretraining", "from .. import inference"),
        ("model.__init__", "from .. import cli"),
        ("fields", "import bert_lightning.training.optim"),
        ("fields", "from bert_lightning import __version__"),
        ("tasks.base", "import importlib\nimportlib.import_module('bert_lightning.training')"),
        ("data.corpus", "def f(x):\n    return import_module(f'bert_lightning.commands.{x}')"),
        ("model.bert", "CFG = {'_target_': 'bert_lightning.data.pretraining.PretrainDataModule'}"),
    ],
)
def test_an_upward_import_is_caught(name, source):
    assert upward(name, source), source


def test_a_downward_or_level_import_passes():
    assert not upward("training.finetune", "from .finetune_module import FinetuneModule")
    assert not upward("tasks.base", "from ..data.tables import collate\nfrom . import metrics")
    assert not upward("cli", "import_module(f'bert_lightning.commands.{name}')")


@pytest.mark.parametrize(
    "rel, text",
    [
        ("data/x.yaml", "_target_: bert_lightning.experiments.brackets.report.main"),
        ("model/x.yaml", "_target_: bert_lightning.data.pretraining.PretrainDataModule"),
        ("task/x.yaml", "head:\n  _target_: bert_lightning.training.optim.adamw"),
        ("trainer/x.yaml", "plugins:\n  - _target_: bert_lightning.commands.score.score"),
        ("x.yaml", "hydra:\n  callbacks:\n    s:\n      _target_: bert_lightning.cli.main"),
        ("experiment/x.yaml", "# @package _global_\ndata:\n  _target_: bert_lightning.tasks.X"),
        ("optim/x.yaml", "f: ${get_method:bert_lightning.serving.Score}"),
    ],
)
def test_an_upward_config_target_is_caught(rel, text):
    assert config_upward(Path(rel), text), text


def test_unknown_module_has_no_layer():
    with pytest.raises(AssertionError, match="no layer"):
        layer("nonexistent.module")


# the modules a run's config passes through (a call given a DictConfig), in the order entered
CONFIG_WALK = {
    "train": ["training/pretrain.py", "training/run.py", "training/instantiate.py",
              "training/resume.py", "fields.py", "data/pretraining.py", "training/start.py",
              "training/trainer.py"],
    "finetune": ["training/finetune.py", "training/run.py", "training/instantiate.py",
                 "training/resume.py", "training/trainer.py"],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("kind", CONFIG_WALK)
def test_a_runs_config_is_read_in_its_few_rooms(kind, tmp_path):
    """Every function of the package handed a DictConfig during `train(cfg)` / `finetune(cfg)`
    (traced): the config stays in the modules listed; the rest (the run folder, the model, the
    tasks' readers) are handed plain values."""
    from omegaconf import DictConfig

    from bert_lightning.config import compose
    from bert_lightning.training.finetune import finetune
    from bert_lightning.training.pretrain import train
    from finetune_fixtures import overrides, task_files, write_tokenizer
    from helpers import tiny_overrides, write_corpus

    if kind == "train":
        write_corpus(tmp_path / "corpus.jsonl")
        run, cfg = train, compose("train", tiny_overrides(tmp_path))
    else:
        write_tokenizer(tmp_path / "tokenizer.json")
        files = task_files(tmp_path, "seq_classification")
        run, cfg = finetune, compose("finetune", overrides(tmp_path, "seq_classification", *files))
    entered = []

    def tracer(frame, event, arg):
        code = frame.f_code
        path = Path(code.co_filename)
        if event == "call" and path.is_relative_to(PACKAGE):
            given = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
            if any(isinstance(frame.f_locals.get(v), DictConfig) for v in given):
                entered.append(path.relative_to(PACKAGE).as_posix())

    sys.settrace(tracer)
    try:
        run(cfg)
    finally:
        sys.settrace(None)
    assert list(dict.fromkeys(entered)) == CONFIG_WALK[kind]
