"""private_api.py, the one door to the private names of Hydra, OmegaConf, torch and LitServe:
each function on the installed release's real objects, each failing with one line naming the
release and the name when a release moves it; and no module of the package outside the doors
(this one and training/lightning_api.py, Lightning's) touching a private name of any of them or
of Lightning."""

import ast
import importlib
import importlib.util
import inspect
import multiprocessing
import re
import sys
from pathlib import Path

import hydra
import litserve
import omegaconf
import pytest
import torch
from omegaconf import OmegaConf
from omegaconf.errors import ConfigAttributeError
from torch.utils.data import DataLoader

from bert_lightning import private_api as api
from helpers import PACKAGE

DOORS = {PACKAGE / "private_api.py", PACKAGE / "training" / "lightning_api.py"}
LIBRARIES = ("lightning", "hydra", "omegaconf", "torch", "litserve")


def test_config_root_is_the_config_a_key_error_names_a_node_of():
    cfg = OmegaConf.create({"trainer": {"max_steps": 1}, "optim": {"lr": 0.1}})
    OmegaConf.set_struct(cfg, True)
    with pytest.raises(ConfigAttributeError) as e:
        cfg.trainer.max_stepz  # noqa: B018
    assert e.value.parent_node is cfg.trainer and api.config_root(e.value.parent_node) is cfg


def test_hydra_runs_each_function_through_around_for_the_block():
    utils = importlib.import_module("hydra._internal.utils")
    hydra_report, seen = utils.run_and_report, []

    def around(function):
        return lambda: seen.append(function()) or "around"

    with api.hydra_runs_through(around):
        assert utils.run_and_report(lambda: "composed") == "around"
    assert seen == ["composed"] and utils.run_and_report is hydra_report


def test_set_last_lr_is_what_the_scheduler_reports_and_saves():
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(sgd, lambda step: 1.0)
    api.set_last_lr(sched, [0.5])
    assert sched.get_last_lr() == [0.5] == sched.state_dict()["_last_lr"]


def test_end_workers_ends_a_persistent_loaders_workers():
    loader = DataLoader(range(4), num_workers=1, persistent_workers=True)
    assert next(iter(loader)).tolist() == [0]
    workers = set(multiprocessing.active_children())
    assert workers
    api.end_workers(loader)
    assert not workers & set(multiprocessing.active_children())
    for other in (DataLoader(range(4)), None, [loader]):  # no workers, not a loader: nothing
        api.end_workers(other)


class Kept(api.MovesKept, torch.nn.Module):
    kept = ("other",)

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        object.__setattr__(self, "other", torch.nn.Linear(2, 2))


def test_moves_kept_moves_what_the_state_dict_leaves_out():
    module = Kept().to(torch.float64)
    assert module.layer.weight.dtype == module.other.weight.dtype == torch.float64
    assert list(module.state_dict()) == ["layer.weight", "layer.bias"]


class Echo(litserve.LitAPI):
    def setup(self, device):
        pass

    def predict(self, x):
        return x


def test_a_litservers_shutdown_event_is_none_before_it_runs():
    assert api.shutdown_event(litserve.LitServer(Echo(), accelerator="cpu", devices=1)) is None


def release(module) -> str:
    return {hydra: "Hydra", omegaconf: "OmegaConf", torch: "torch", litserve: "LitServe"}[
        module
    ] + f" {module.__version__}"


def moved(module, name: str) -> str:
    return (
        rf"^{re.escape(release(module))} has no {re.escape(name)}, which "
        r"bert_lightning/private_api\.py reads: update it for this release$"
    )


def loader_with_iterator(iterator) -> DataLoader:
    loader = DataLoader(range(4), num_workers=1)
    loader._iterator = iterator
    return loader


MOVED = [  # (call on a stand-in that lacks the name, its library, the name)
    (lambda: api.config_root(object()), omegaconf, "object._get_root"),
    (lambda: api.set_last_lr(object(), [0.1]), torch, "object._last_lr"),
    (lambda: api.end_workers(loader_with_iterator(object())), torch, "object._shutdown_workers"),
    (lambda: api.shutdown_event(object()), litserve, "object._shutdown_event"),
]


@pytest.mark.parametrize(("call", "module", "name"), MOVED, ids=[n for *_, n in MOVED])
def test_a_moved_name_is_one_line_naming_release_and_name(call, module, name):
    with pytest.raises(api.LibraryMoved, match=moved(module, name)):
        call()


def enter_hydra_runs_through() -> None:
    with api.hydra_runs_through(id):
        pass


def test_moved_hydra_report_or_module_apply_is_one_line(monkeypatch):
    utils = importlib.import_module("hydra._internal.utils")
    monkeypatch.delattr(utils, "run_and_report")
    name = "hydra._internal.utils.run_and_report"
    with pytest.raises(api.LibraryMoved, match=moved(hydra, name)):
        enter_hydra_runs_through()
    monkeypatch.setitem(sys.modules, "hydra._internal.utils", None)  # as if no such module
    with pytest.raises(api.LibraryMoved, match=moved(hydra, "hydra._internal.utils")):
        enter_hydra_runs_through()
    monkeypatch.delattr(torch.nn.Module, "_apply")
    with pytest.raises(api.LibraryMoved, match=moved(torch, "Module._apply")):
        type("Moved", (api.MovesKept, torch.nn.Module), {})


# Private names a library's classes define or keep on `self` (its module-level ones are reached
# through its modules, which the scan follows); measured against the installed release, as
# bytes (torch's 2,000 files in a second or two).
MEMBER = re.compile(rb"(?:def |self\.)(_[a-zA-Z]\w*)")
GETATTR = {"getattr", "hasattr", "setattr", "delattr"}


def library_names(library: str) -> set[str]:
    names: set[str] = set()
    for path in Path(importlib.util.find_spec(library).origin).parent.rglob("*.py"):
        names |= member_names(path.read_bytes())
    return names


def member_names(source: bytes) -> set[str]:
    return {name.decode() for name in MEMBER.findall(source)}


def members(cls: type, library: str) -> set[str]:
    """The private names of the classes of `library` among `cls`'s bases."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.partition(".")[0] == library:
            names |= {n for n in vars(base) if is_private(n)}
            names |= member_names(inspect.getsource(base).encode())
    return names


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def on_self(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id in ("self", "cls")) or (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"
    )


def of(library: str, dotted: str | None) -> bool:
    return (dotted or "").partition(".")[0] == library


def private_imports(tree: ast.Module, library: str) -> list[tuple[int, str]]:
    """`from library... import _name` and a module path through a `_`-module of the library."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            paths = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            paths = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for path in paths:
            if of(library, path) and any(map(is_private, path.split("."))):
                found.append((node.lineno, f"imports {path}"))
    return found


def through_modules(tree: ast.Module, library: str) -> list[tuple[int, str]]:
    """`name._x`, `name.y._x`... where `name` is what an import of the library binds (`torch`,
    `nn` of `from torch import nn`, `OmegaConf`)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names if of(library, a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and of(library, node.module):
            bound |= {a.asname or a.name for a in node.names}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in bound:
                found.append((node.lineno, f"uses {ast.unparse(node)}"))
    return found


def class_uses(cls: ast.ClassDef) -> dict[str, int]:
    """The `_`-names a class of ours defines, overrides or uses on `self` -> a line of each."""
    uses = {
        n.name if isinstance(n, ast.FunctionDef) else n.attr: n.lineno
        for n in ast.walk(cls)
        if (isinstance(n, ast.FunctionDef) and n in cls.body)
        or (isinstance(n, ast.Attribute) and on_self(n.value))
    }
    return {name: line for name, line in uses.items() if is_private(name)}


def other_objects_names(tree: ast.Module) -> list[tuple[int, str]]:
    """`x._name` and `getattr(x, "_name")` (has-, set-, del-) of an `x` not `self`."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and is_private(n.attr) and not on_self(n.value):
            found.append((n.lineno, n.attr))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in GETATTR:
            obj, name = (n.args + [None, None])[:2]
            text = name.value if isinstance(name, ast.Constant) else None
            if isinstance(text, str) and is_private(text) and not on_self(obj):
                found.append((n.lineno, text))
    return found


@pytest.mark.parametrize("library", LIBRARIES)
def test_no_private_name_of_the_library_outside_the_doors(library):
    """Outside the doors: no import of a `_`-name of the library's, nor a `_`-name reached
    through a module or class it imports; no class that defines, overrides or uses on `self` a
    `_`-name its bases of the library have; no `x._name` (or `getattr(x, "_name")`) of a name
    the library's classes have, unless a class of ours has that name of its own. A door reads
    several libraries, some private names alike (`_iterator`: torch's and Lightning's)."""
    names = library_names(library)
    hits, own, foreign = [], set(), []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path in DOORS:
            continue
        where, tree = path.relative_to(PACKAGE), ast.parse(path.read_text())
        hits += [(where, n, what) for n, what in private_imports(tree, library)]
        hits += [(where, n, what) for n, what in through_modules(tree, library)]
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            uses = class_uses(cls)
            theirs = set()
            if uses.keys() & names:  # of ours, unless a base of the library has it
                module = ".".join(where.with_suffix("").parts)
                ours = getattr(importlib.import_module(f"bert_lightning.{module}"), cls.name)
                theirs = uses.keys() & members(ours, library)
            hits += [(where, uses[name], f"{cls.name} uses {name}") for name in theirs]
            own |= uses.keys() - theirs
        foreign += [(where, n, name) for n, name in other_objects_names(tree)]
    hits += [(where, n, f"uses {name}") for where, n, name in foreign if name in names - own]
    listed = "\n".join(f"{where}:{n}: {what}" for where, n, what in hits)
    assert not hits, f"{library}'s private names outside the doors:\n{listed}"
