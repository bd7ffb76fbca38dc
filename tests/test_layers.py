"""The layout is the architecture: a module imports only from its own layer or the layers
below it (model < data < tasks, training < checkpoint, interop < commands, experiments), so a
reader follows a batch from a C4 line to the loss without jumping back and forth."""

import ast
from pathlib import Path

import bert_lightning

PACKAGE = Path(bert_lightning.__file__).parent
LAYERS = [  # (module prefix, layer); the longest matching prefix wins
    ("atomic", 0),  # standard-library helpers every layer uses
    ("fields", 0),
    ("errors", 0),
    ("model", 1),
    ("data", 2),
    ("tasks", 3),
    ("training", 3),
    ("checkpoint", 4),
    ("interop", 4),
    ("config", 5),
    ("commands", 5),
    ("serving", 5),  # the server behind `bert-lightning serve`
    ("experiments", 5),
    ("cli", 5),
    ("__main__", 5),
    ("__init__", 5),
]
ALLOWED = {("training", "checkpoint")}  # runs read a resumed or pretrained checkpoint


def layer(name: str) -> tuple[str, int]:
    top = name.split(".")[0]
    for prefix, n in LAYERS:
        if top == prefix:
            return prefix, n
    raise AssertionError(f"bert_lightning.{name}: no layer; add it to LAYERS")


def imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "bert_lightning":
                yield from (a.name for a in node.names)
            elif node.module.startswith("bert_lightning."):
                yield node.module.removeprefix("bert_lightning.")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("bert_lightning."):
                    yield a.name.removeprefix("bert_lightning.")


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
        own, n = layer(name)
        for target in imports(path):
            other, m = layer(target)
            if m > n and (own, other) not in ALLOWED:
                upward.append(f"{name} -> {target}")
    assert not upward, upward
