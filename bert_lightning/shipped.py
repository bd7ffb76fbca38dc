"""Where the package's own files are: the YAML tree of configs and the bundled assets; and a
config group's shipped values read without Hydra, for what a stored config (in a checkpoint or
an export) lacks because it was written before a key existed."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

PACKAGE = Path(__file__).resolve().parent
# the YAML tree: bert_lightning/conf/ inside an installed wheel, else conf/ at the top of the
# checkout the package runs from (an editable install, or the repository on sys.path); the one
# is the other, by pyproject.toml's package-dir
CONFIG_DIR = PACKAGE / "conf" if (PACKAGE / "conf").is_dir() else PACKAGE.parent / "conf"
ASSETS = PACKAGE / "assets"
GLOBAL = "# @package _global_"  # the first line of an option that sets keys at the top


def group_defaults(group: str, name: str) -> dict:
    """`conf/<group>/<name>.yaml` with its defaults list merged in order, as Hydra composes a
    group of plain values (no interpolations, no overrides)."""
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / group / f"{name}.yaml"))
    defaults = raw.pop("defaults", ["_self_"])
    out: dict = {}
    for d in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        out |= raw if d == "_self_" else group_defaults(group, d)
    return out


def root_keys(name: str) -> dict:
    """The top-level keys a root config (`train`, `finetune`) gives: its own values (a plain
    node as it is: a key an experiment adds under it is not the root's) and, as None, its
    groups and `hydra`."""
    raw = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{name}.yaml"))
    groups = [next(iter(d)) for d in raw.pop("defaults") if isinstance(d, dict)]
    names = (g.removeprefix("optional ").partition("@")[0] for g in groups)
    return {g: None for g in names if "/" not in g} | raw | {"hydra": None}


def global_groups() -> set[str]:
    """The groups whose every shipped option is `@package _global_` (experiment, dataset,
    debug, hparams_search): a key under such a group's name was set by a file that is not."""
    return {
        d.name
        for d in CONFIG_DIR.iterdir()
        if (files := list(d.glob("*.yaml")))
        and all(f.read_text(encoding="utf-8").startswith(GLOBAL) for f in files)
    }


def global_keys() -> set[str]:
    """The top-level keys the shipped `@package _global_` options add of their own (an
    experiment's `grammar_data`, a data set's `data_dir`)."""
    keys = set()
    for file in CONFIG_DIR.rglob("*.yaml"):
        if file.read_text(encoding="utf-8").startswith(GLOBAL):
            keys |= set(OmegaConf.load(file)) - {"defaults"}
    return keys
