"""The one door to the private names of Hydra, OmegaConf, torch and LitServe (Lightning's have
theirs, training/lightning_api.py): every `_`-name of theirs the package reads, calls or
overrides is here, each behind a function that says what it reads and why the public API does
not give it. A release that moves one fails here with one line naming the release and the name
(`LibraryMoved`); tests/test_private_api.py checks each on the installed releases and that
nothing else in the package touches such a name. Each library is imported where it is used:
the config module imports this one, and its `--help` imports no torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import ModuleType
from typing import Any

RELEASES = {"hydra": "Hydra", "omegaconf": "OmegaConf", "torch": "torch", "litserve": "LitServe"}


class LibraryMoved(RuntimeError):
    """The installed release of a library lacks a private name that `door` reads."""

    door = "bert_lightning/private_api.py"


def _moved(release: str, name: str, error: type[LibraryMoved] = LibraryMoved) -> LibraryMoved:
    return error(f"{release} has no {name}, which {error.door} reads: update it for this release")


def reach(
    obj: Any, path: Sequence[str], release: str, error: type[LibraryMoved] = LibraryMoved
) -> Any:
    """`obj.path[0].path[1]...`, or `error` naming `release` and the first missing name."""
    for name in path:
        try:
            obj = getattr(obj, name)
        except AttributeError:
            kind = obj.__name__ if isinstance(obj, type | ModuleType) else type(obj).__name__
            raise _moved(release, f"{kind}.{name}", error) from None
    return obj


def _release(library: str) -> str:
    return f"{RELEASES[library]} {importlib.import_module(library).__version__}"


def _private(library: str, obj: Any, *path: str) -> Any:
    return reach(obj, path, _release(library))


def config_root(node) -> Any:
    """The whole config an OmegaConf node belongs to (the parent node a key error names):
    OmegaConf links a node to its parent privately and gives no root."""
    return _private("omegaconf", node, "_get_root")()


@contextmanager
def hydra_runs_through(around: Callable[[Callable[[], Any]], Callable[[], Any]]) -> Iterator[None]:
    """Within the block, each function Hydra's `run_and_report` runs (composing the config, then
    the task) runs as `around(function)`, inside the report Hydra prints of a failure: Hydra has
    no hook there. Its entry point calls the private module's global, replaced for the block."""
    try:
        utils = importlib.import_module("hydra._internal.utils")
    except ModuleNotFoundError:
        raise _moved(_release("hydra"), "hydra._internal.utils") from None
    hydra_report = _private("hydra", utils, "run_and_report")
    utils.run_and_report = lambda function: hydra_report(around(function))
    try:
        yield
    finally:
        utils.run_and_report = hydra_report


def set_last_lr(scheduler, rates: Sequence[float]) -> None:
    """A torch scheduler's `get_last_lr()` (what it reports and saves) set to `rates`: only its
    `step` sets it, which would also move the schedule on."""
    _private("torch", scheduler, "_last_lr")
    scheduler._last_lr = list(rates)


def end_workers(loader) -> None:
    """The worker processes of a torch DataLoader's iterator in use, ended now: torch ends them
    once the iterator is done or collected, and keeps the iterator and its shutdown private."""
    from torch.utils.data import DataLoader

    if isinstance(loader, DataLoader) and loader.num_workers:
        workers = _private("torch", loader, "_iterator")
        if workers is not None:
            _private("torch", workers, "_shutdown_workers")()


class MovesKept:
    """A torch Module mixin: moves to a device or dtype (`to`, `half`, Lightning's precision)
    reach the modules it keeps in its `__dict__` by the names in `kept`, out of its state dict,
    parameters and optimizer. Every such move runs the Module's private `_apply`, which no
    public hook precedes."""

    kept: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        import torch

        _private("torch", torch.nn.Module, "_apply")  # else ours overrides nothing

    def _apply(self, fn, *args, **kwargs):
        for name in self.kept:
            if name in self.__dict__:
                self.__dict__[name]._apply(fn, *args, **kwargs)
        return super()._apply(fn, *args, **kwargs)


def shutdown_event(server) -> Any:
    """A LitServer's shutdown event, which its own /shutdown route sets to end `run()` and every
    process it started (None before `run()` made it): LitServe has no call for it."""
    return _private("litserve", server, "_shutdown_event")
