"""Hydra config sections -> checked objects: a section's values checked against its
`_target_`'s annotations and a `???` value named before anything runs, each as one line naming
the key. Apart from `fields.py`'s checks, which stay standard library at the bottom of the
layers: these need Hydra and OmegaConf."""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import get_type_hints

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import InstantiationException
from hydra.utils import get_object
from hydra.utils import instantiate as hydra_instantiate
from omegaconf import DictConfig, OmegaConf

from bert_lightning.errors import UserError, user_error
from bert_lightning.fields import check_values


def instantiate(node, where: str, **kwargs):
    """Hydra's `instantiate` of the config section `where` (data, model, trainer, ...), after
    checking its values against the annotations of its `_target_`'s parameters: a value of the
    wrong type (`data.batch_size=abc`) is an error naming the key, not a traceback from deep
    inside the code that first uses it. A UserError raised by the target is raised as it is,
    not wrapped in Hydra's InstantiationException. `kwargs` replace the section's values and
    reach the target as they are: Hydra builds the section (a partial), never a value handed
    in, so a value read from a file (a checkpoint's record) is never a `_target_` to build."""
    check_types(node, where, given=kwargs.keys())
    try:
        built = hydra_instantiate(node, _partial_=True)
        if node.get("_partial_"):  # Hydra's partial (its `keywords`, the section's values)
            return partial(built, **kwargs) if kwargs else built
        try:
            return built(**kwargs)
        except UserError:
            raise
        except Exception as e:  # as Hydra's own call raises it: callers read its cause
            raise InstantiationException(f"{where}: {node['_target_']}: {e}") from e
    except InstantiationException as e:
        if (mistake := user_error(e)) is not None:
            raise mistake from None
        raise


def check_types(node, where: str, given: Iterable[str] = ()) -> None:
    """`instantiate`'s check alone: the values of a section built later (optim). Keys `given`
    another value, and those still `???` (for `required` to name), are not checked."""
    target = get_object(node["_target_"])
    # a subclass's `**kwargs` reach its bases: their annotations count too
    fns = [c.__init__ for c in reversed(target.__mro__)] if isinstance(target, type) else [target]
    hints = {}
    for fn in fns:
        try:
            hints |= get_type_hints(fn)
        except Exception:  # annotations this Python cannot evaluate: nothing to check
            continue
    skip = set(given)
    values = {
        k: node[k]
        for k in node
        if not str(k).startswith("_") and k not in skip and not is_missing(node, k)
    }
    check_values(values, hints, where)


def is_missing(node, key) -> bool:
    """`???` in a config (a plain dict, such as a module's hparams, has none)."""
    return OmegaConf.is_config(node) and OmegaConf.is_missing(node, key)


def missing_keys(node: DictConfig, prefix: str = "") -> list[str]:
    """The keys still `???`, found without resolving anything (OmegaConf's own
    `missing_keys` resolves, and fails on an interpolation of a missing value)."""
    found = []
    for key in node:
        if OmegaConf.is_missing(node, key):
            found.append(f"{prefix}{key}")
        elif not OmegaConf.is_interpolation(node, key) and isinstance(node[key], DictConfig):
            found += missing_keys(node[key], f"{prefix}{key}.")  # a section: nothing resolved
    return found


def required(cfg: DictConfig) -> None:
    """A value still `???` (a data option's train_files, a data set's data_dir, a task's
    train_file) is named in one line before anything runs."""
    missing = missing_keys(cfg)
    if missing:
        raise UserError(
            f"{', '.join(missing)}: required and not given; add "
            + " ".join(f"{k}=..." for k in missing)
            + " to the command"
        )


def command_line(*keys: str) -> list[str]:
    """The command line's overrides of `keys` (a group or a key, dotted or not: `model` takes
    `model=...` and `model.<field>=...`, `data.tokenizer.vocab_size` that one key, and a
    parent's dictionary that names it: `data={tokenizer:{...}}`), none outside a Hydra run:
    what a user asked for, not a default, so that a setting the run would ignore is refused."""
    if not HydraConfig.initialized():
        return []

    def sets(override: str, key: str) -> bool:
        parsed = OverridesParser.create().parse_overrides([override])[0]
        name, value = parsed.key_or_group, parsed.value()
        if name == key or name.startswith(f"{key}."):
            return True
        if not key.startswith(f"{name}."):
            return False
        for part in key.removeprefix(f"{name}.").split("."):  # down the dictionary it gives
            if not isinstance(value, dict) or part not in value:
                return False
            value = value[part]
        return True

    return [o for o in HydraConfig.get().overrides.task if any(sets(o, k) for k in keys)]
