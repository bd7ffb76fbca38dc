import ast
import csv
import inspect
import json
import logging
import math
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import get_object, instantiate
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import OmegaConf

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.cli import main
from bert_lightning.config import CONFIG_DIR, bundled, compose
from bert_lightning.data.brackets import write_grammar_data
from bert_lightning.data.masking import MaskingConfig
from bert_lightning.data.tokenizer import TokenizerConfig, load_tokenizer
from bert_lightning.model import BertConfig
from bert_lightning.tasks import metrics
from bert_lightning.training.finetune import finetune
from finetune_fixtures import overrides, sentiment_rows, write_csv, write_our_ckpt, write_tokenizer
from helpers import PACKAGE, pretrain_tiny

# each experiment's first lines give its command, and so its entry point
FINETUNE_EXPERIMENTS = {
    p.stem
    for p in (CONFIG_DIR / "experiment").glob("*.yaml")
    if "python finetune.py" in p.read_text()
}
FINETUNE_GROUPS = ("task", "dataset")  # groups of finetune.py only
GROUP_OPTIONS = [
    (group.name, option.stem)
    for group in sorted(
        p for p in CONFIG_DIR.iterdir() if p.is_dir() and p.name not in FINETUNE_GROUPS
    )
    for option in sorted(group.glob("*.yaml"))
    if option.stem not in FINETUNE_EXPERIMENTS and not option.stem.startswith("_")
]
# (layers, width) of the published BERTs: BERT-Base and -Large (Devlin et al., 2018) and the
# compact models (Turc et al., 2019); all have 64-wide heads and a 4 x width feed-forward layer
PUBLISHED = {
    "bert_tiny": (2, 128),
    "bert_mini": (4, 256),
    "bert_small": (4, 512),
    "bert_medium": (8, 512),
    "bert_base": (12, 768),
    "bert_large": (24, 1024),
}
TOY_MODELS = {"brackets"}  # conf/model/ shapes of our own


def test_every_experiment_names_its_one_entry_point():
    for path in (CONFIG_DIR / "experiment").glob("*.yaml"):
        text = path.read_text()
        commands = {
            e for e in ("train.py", "finetune.py") if f"python {e} experiment={path.stem}" in text
        }
        assert len(commands) == 1, (path.name, commands)
    assert {"brackets_grammar", "home_depot_minilm"} == FINETUNE_EXPERIMENTS


def test_home_depot_experiment_composes(tmp_path):
    """MiniLM's folder comes from its installed PyPI package, the data from `data_dir`."""
    over = ["experiment=home_depot_minilm", f"data_dir={tmp_path}", f"paths.log_dir={tmp_path}"]
    cfg = compose("finetune", over)
    assert (Path(cfg.init_from) / "config.json").is_file()
    assert cfg.task.kind == "ad_relevance" and cfg.task.train_file == f"{tmp_path}/train.csv.zip"


@pytest.mark.parametrize("option", sorted(FINETUNE_EXPERIMENTS - {"home_depot_minilm"}))
def test_finetune_experiments_compose(option, tmp_path):
    cfg = compose("finetune", [f"experiment={option}", f"paths.log_dir={tmp_path}"])
    assert not any(tmp_path.iterdir())  # composing a config writes nothing
    write_grammar_data(tmp_path / "brackets_grammar_data")  # the explicit step
    assert Path(cfg.task.train_file).is_file() and Path(cfg.data.tokenizer.path).is_file()


@pytest.mark.parametrize(("group", "option"), GROUP_OPTIONS)
def test_every_config_composes(group, option, tmp_path):
    cfg = compose(overrides=[f"{group}={option}", f"paths.output_dir={tmp_path}"])
    m = cfg.model  # whatever the option, a model of whole heads and BERT's feed-forward ratio
    assert m.hidden_size % m.num_attention_heads == 0, (group, option)
    if group != "debug":  # debug=tiny: the tests' model, 2 x width
        assert m.intermediate_size == 4 * m.hidden_size, (group, option)
    if group == "model":
        assert isinstance(instantiate(cfg.model, vocab_size=100), BertConfig)
    if group == "data" and "train_files" in cfg.data:
        for key in ("train_files", "val_files"):  # options whose files the user must name
            if OmegaConf.is_missing(cfg.data, key):
                cfg.data[key] = bundled("c4_sample.jsonl")
        dm = instantiate(cfg.data, out_dir=None)
        files = getattr(dm, "train_files", None)  # None: streamed
        assert files is None or Path(files[0]).is_file()


@pytest.mark.parametrize("option", sorted(PUBLISHED))
def test_model_presets_have_the_published_sizes(option):
    m = compose(overrides=[f"model={option}"]).model
    assert (m.num_hidden_layers, m.hidden_size) == PUBLISHED[option]
    assert m.hidden_size == 64 * m.num_attention_heads
    assert m.intermediate_size == 4 * m.hidden_size


def test_every_model_preset_is_a_published_size_or_a_named_toy():
    presets = {p.stem for p in (CONFIG_DIR / "model").glob("*.yaml") if not p.stem.startswith("_")}
    assert presets == PUBLISHED.keys() | TOY_MODELS


def test_eight_devices_mean_ddp(tmp_path):
    """`python train.py model=bert_base trainer.devices=8` on 8 GPUs runs DDP; the same
    choice is made on the CPU, where the strategy can be checked without GPUs."""
    cfg = compose(
        overrides=[
            "model=bert_base",
            "trainer.devices=8",
            "trainer.accelerator=cpu",
            f"paths.output_dir={tmp_path}",
        ]
    )
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
    assert isinstance(trainer.strategy, DDPStrategy)
    assert trainer.num_devices == 8
    assert cfg.model.num_hidden_layers == 12


@pytest.mark.parametrize("gpus", [0, 8])
def test_the_cards_command_is_a_gpu_run_on_gpus_and_fp32_on_a_cpu(gpus, tmp_path, monkeypatch):
    """`python train.py model=bert_base trainer.devices=8` brings what a GPU run needs where
    there are GPUs (bf16 autocast, loader workers) and keeps a CPU run fp32 in one process;
    so do the GPU presets, and fine-tuning."""
    monkeypatch.setattr("lightning.fabric.accelerators.cuda.num_cuda_devices", lambda: gpus)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    cfg = compose("train", ["model=bert_base", "trainer.devices=8", f"paths.output_dir={tmp_path}"])
    ft = compose("finetune", ["task.train_file=x", f"paths.output_dir={tmp_path}"])
    expected = ("bf16-mixed", 4) if gpus else ("32-true", 0)
    assert (cfg.trainer.precision, cfg.data.num_workers) == expected
    assert ft.trainer.precision == expected[0]
    for preset in ("gpu", "ddp", "fsdp", "deepspeed"):
        gpu = compose("train", [f"trainer={preset}", f"paths.output_dir={tmp_path}"])
        assert (gpu.trainer.precision, gpu.data.num_workers) == ("bf16-mixed", 4), preset
    for preset in ("cpu", "ddp_sim"):
        cpu = compose("train", [f"trainer={preset}", f"paths.output_dir={tmp_path}"])
        assert (cpu.trainer.precision, cpu.data.num_workers) == ("32-true", 0), preset


@pytest.mark.parametrize("avx512_bf16, amx", [(False, False), (True, False), (False, True)])
def test_the_cpu_presets_autocast_to_bf16_only_where_the_cpu_has_it(
    avx512_bf16, amx, tmp_path, monkeypatch
):
    """An AVX2 CPU emulates bf16 many times slower than fp32: the CPU presets run fp32 there."""
    caps = {"avx512_bf16": avx512_bf16, "amx_bf16": amx}
    monkeypatch.setattr("torch.cpu.get_capabilities", lambda: caps)
    expected = "bf16-mixed" if avx512_bf16 or amx else "32-true"
    for experiment in ("cpu_30min", "tapt_minilm", "distill_minilm"):
        cfg = compose("train", [f"experiment={experiment}", f"paths.output_dir={tmp_path}"])
        assert cfg.trainer.precision == expected, experiment


def test_debug_tiny_shrinks_either_entry_points_run(tmp_path):
    """`debug=tiny`: the tests' tiny encoder for both entry points, with each one's own part
    (train.py's data and steps, finetune.py's lengths and epochs) and nothing of the other's."""
    out = f"paths.output_dir={tmp_path}"
    pre = compose("train", ["debug=tiny", out])
    ft = compose("finetune", ["debug=tiny", "task.train_file=x", out])
    for cfg in (pre, ft):
        assert cfg.model.hidden_size == 32 and cfg.trainer.accelerator == "cpu"
        assert "debug" not in cfg
    assert (pre.data.max_seq_length, pre.trainer.max_steps, pre.data.tokenizer.vocab_size) == (
        32,
        6,
        600,
    )
    assert "task" not in pre and set(ft.data) == {
        "tokenizer",
        "max_seq_length",
        "batch_size",
        "eval_batch_size",
    }
    assert ft.data.tokenizer.vocab_size == 8192  # train.py's part does not reach finetune.py's
    assert (
        ft.data.max_seq_length,
        ft.data.batch_size,
        ft.trainer.max_epochs,
        ft.trainer.max_steps,
    ) == (
        32,
        8,
        2,
        -1,
    )
    plain = compose("finetune", ["task.train_file=x", out])
    assert (plain.data.max_seq_length, plain.trainer.max_epochs) == (128, 3)


def test_precision_and_seed_come_from_the_config(tmp_path):
    cfg = compose(
        overrides=["trainer.precision=bf16-mixed", "seed=7", f"paths.output_dir={tmp_path}"]
    )
    trainer = instantiate(cfg.trainer, accelerator="cpu", logger=False, enable_checkpointing=False)
    assert trainer.precision == "bf16-mixed" and cfg.data.seed == 7


def leaves(node: dict, prefix: str = "") -> dict:
    """A YAML mapping's values by dotted key, its defaults list left out."""
    out = {}
    for k, v in node.items():
        if isinstance(v, dict):
            out.update(leaves(v, f"{prefix}{k}."))
        elif k != "defaults":
            out[f"{prefix}{k}"] = v
    return out


def test_no_option_restates_a_value_of_the_option_it_builds_on():
    """An option built on another of its group (optim/finetune on adamw, data/corpus on
    _corpus, trainer/gpu on default) states only what differs: one home for each value. A
    required `???` may be restated (an option that requires it derives from the base)."""
    restated = []
    for path in sorted(CONFIG_DIR.glob("*/*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        own = leaves(raw)
        for base in raw.get("defaults", []):
            base_file = path.parent / f"{base}.yaml"
            if isinstance(base, str) and base_file.is_file():
                theirs = leaves(yaml.safe_load(base_file.read_text()) or {})
                restated += [
                    f"{path.relative_to(CONFIG_DIR)}: {k}"
                    for k, v in own.items()
                    if k in theirs and theirs[k] == v and v != "???"
                ]
    assert not restated


def restated_by_experiment(experiment: str, out: str) -> list[str]:
    """The keys `experiment` sets to the value they already have in the config its options
    compose (its defaults list's `override /group: option`s on its entry point, without the
    experiment): those lines say nothing. A required `???` is not a value."""
    path = CONFIG_DIR / "experiment" / f"{experiment}.yaml"
    raw = OmegaConf.to_container(OmegaConf.load(path))
    options = [
        f"{group.strip().removeprefix('override /')}={option.strip()}"
        for entry in raw.pop("defaults", [])
        for group, option in entry.items()
    ]
    entry = "finetune" if experiment in FINETUNE_EXPERIMENTS else "train"
    base = leaves(OmegaConf.to_container(compose(entry, [*options, out]), resolve=False))
    return [
        f"experiment/{experiment}.yaml: {k}"
        for k, v in leaves(raw).items()
        if k in base and base[k] == v and v != "???"
    ]


@pytest.mark.parametrize(
    "experiment", sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
)
def test_no_experiment_restates_a_value_of_the_options_it_composes(experiment, tmp_path):
    """An experiment states only what differs from the options it composes (model, data,
    schedule=time_budget, the entry point's defaults): one home for each value."""
    assert not restated_by_experiment(experiment, f"paths.output_dir={tmp_path}")


# mirrors transformers.BertConfig, defaults included: a Hugging Face config.json omits what it
# leaves at them, and our own fields are absent from every folder written by transformers
HF_MIRROR = "bert_lightning.model.BertConfig"


def own_defaults(target: str) -> set[str]:
    """The parameters of `target` (a function, or a class's `__init__` and those of its bases)
    that our own code gives a default; a library's base class (Lightning's) keeps its own."""
    obj = get_object(target)
    if not isinstance(obj, type):
        fns = [obj]
    elif is_dataclass(obj):
        return {f.name for f in fields(obj) if f.default is not MISSING}
    else:
        fns = [c.__dict__["__init__"] for c in obj.__mro__ if "__init__" in c.__dict__]
    return {
        name
        for fn in fns
        if getattr(fn, "__module__", "").startswith("bert_lightning")
        for name, param in inspect.signature(fn).parameters.items()
        if param.default is not param.empty
    }


def targets(node, where: str):
    """(where, `_target_`, the keys set) of every section of a config that names our code."""
    if isinstance(node, dict):
        target = node.get("_target_", "")
        if target.startswith("bert_lightning.") and target != HF_MIRROR:
            yield where, target, {k for k in node if not k.startswith("_")}
        for k, v in node.items():
            yield from targets(v, f"{where}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from targets(v, f"{where}[{i}]")


def test_no_value_is_defined_in_the_config_and_in_the_code():
    """A value the config sets has no default in the code that takes it (keyword-only, no
    default, as a task config): one home for each value, the shipped YAML, which the tests
    build through. The sections a DataModule builds itself (masking, tokenizer) as well."""
    both = [
        f"{path.relative_to(CONFIG_DIR)}{where}: {sorted(keys & own_defaults(target))}"
        for path in sorted(CONFIG_DIR.rglob("*.yaml"))
        for where, target, keys in targets(yaml.safe_load(path.read_text()) or {}, "")
        if keys & own_defaults(target)
    ]
    both += [
        f"{cls.__name__}: {sorted(own_defaults(f'{cls.__module__}.{cls.__name__}'))}"
        for cls in (MaskingConfig, TokenizerConfig)
        if own_defaults(f"{cls.__module__}.{cls.__name__}")
    ]
    assert not both


def config_keys(node) -> set[str]:
    """Every key name a config sets, at any depth (Hydra's own and `defaults` aside)."""
    if isinstance(node, list):
        return set().union(*map(config_keys, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    own = {k for k in node if not k.startswith("_") and k not in ("defaults", "hydra")}
    return own.union(*(config_keys(v) for k, v in node.items() if k != "hydra"))


CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))
MIRROR = f"{BertConfig.__module__}.{BertConfig.__name__}"  # HF_MIRROR, where it is defined
# parameters and reads named as a config key that hold another value: where -> why
NOT_A_CONFIG_VALUE = {
    "commands/evaluate.py:_main:baselines": "a metrics dict's optional part",
    "data/brackets.py:write_grammar_data:seed": "the grammar data's own draw (its folder)",
    "data/sampling.py:EpochSampler.__init__:seed": "torch's DistributedSampler signature",
    "errors.py:reported:debug": "the traceback switch, not the debug group",
    "experiments/brackets/report.py:masking_stats:seed": "the report's own draw",
    "experiments/brackets/report.py:evaluate:seed": "the report's held-out draw",
    "tasks/ad_relevance.py:AdRelevance.hf_head:architecture": "older checkpoints: cross",
    "tasks/base.py:Task.hf_head:pooling": "older checkpoints stored none: the pooled [CLS]",
    "tasks/ranking.py:interval:seed": "the bootstrap's draw",
    "training/finetune_module.py:FinetuneModule.train:mode": "nn.Module.train's signature",
    "training/module_base.py:EncoderModule.on_load_checkpoint:tokenizer": "older checkpoints",
}


class RestatedDefaults(ast.NodeVisitor):
    """(where, text) of each literal keyword default (None aside: "not given") of a parameter
    or dataclass field named as a config key, and of each `.get("key", default)`; where is
    `file:qualified.name:key`."""

    def __init__(self, path: Path, keys: set[str]):
        self.file, self.keys, self.scope, self.found = path.relative_to(PACKAGE), keys, [], {}
        self.module = ".".join(("bert_lightning", *self.file.with_suffix("").parts))

    def add(self, key: str, text: str):
        self.found[f"{self.file.as_posix()}:{'.'.join(self.scope)}:{key}"] = text

    def visit_FunctionDef(self, node):
        self.scope.append(node.name)
        a = node.args
        positional = [*a.posonlyargs, *a.args]
        pairs = [*zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True),
                 *zip(a.kwonlyargs, a.kw_defaults, strict=True)]  # fmt: skip
        for arg, d in pairs:
            if arg.arg in self.keys and isinstance(d, ast.Constant) and d.value is not None:
                self.add(arg.arg, f"{node.name}({arg.arg}={ast.unparse(d)})")
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        self.scope.append(node.name)
        if f"{self.module}.{node.name}" != MIRROR:
            for b in node.body:
                named = isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
                if named and b.target.id in self.keys and isinstance(b.value, ast.Constant):
                    self.add(b.target.id, f"{b.target.id} = {ast.unparse(b.value)}")
        self.generic_visit(node)
        self.scope.pop()

    def visit_Call(self, node):
        f, args = node.func, node.args
        get = isinstance(f, ast.Attribute) and f.attr == "get" and len(args) == 2
        if get and isinstance(args[0], ast.Constant) and args[0].value in self.keys:
            self.add(args[0].value, ast.unparse(node))
        self.generic_visit(node)


def test_no_code_default_restates_a_config_key():
    """conf/ is the one home of a value: a keyword default or `.get("key", default)` in the
    package for a key name a YAML file sets is a second one, found by reading each module's
    syntax tree (the shipped value, when code needs one, is read from the YAML: `shipped`).
    `BertConfig` mirrors transformers' (the test above); the others named with a reason."""
    keys = set().union(*(config_keys(yaml.safe_load(p.read_text())) for p in CONFIGS))
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        visitor = RestatedDefaults(path, keys)
        visitor.visit(ast.parse(path.read_text()))
        found |= visitor.found
    assert not {w: t for w, t in found.items() if w not in NOT_A_CONFIG_VALUE}
    assert set(NOT_A_CONFIG_VALUE) <= set(found)  # no stale entry


SCHEDULE_KEYS = ("max_steps", "max_epochs", "val_check_interval", "check_val_every_n_epoch")


@pytest.mark.parametrize("preset", sorted(p.stem for p in (CONFIG_DIR / "trainer").glob("*.yaml")))
def test_a_hardware_preset_keeps_each_run_kinds_schedule(preset, tmp_path):
    """trainer/ presets are hardware and strategy only: fine-tuning keeps its 3 epochs with a
    validation each, pretraining its steps, whichever preset runs them."""
    ft = compose(
        "finetune", [f"trainer={preset}", "task.train_file=x", f"paths.output_dir={tmp_path}"]
    )
    pt = compose("train", [f"trainer={preset}", f"paths.output_dir={tmp_path}"])
    assert [ft.trainer[k] for k in SCHEDULE_KEYS] == [-1, 3, 1.0, 1]
    assert [pt.trainer[k] for k in SCHEDULE_KEYS] == [600, -1, 100, None]


@pytest.mark.parametrize("option", ["c4_local", "c4_hub"])
def test_loader_workers_are_no_more_than_the_cores(option, tmp_path, monkeypatch):
    """4 workers by default, fewer where the process may run on fewer cores."""
    for cores, workers in ((range(2), 2), (range(16), 4)):
        monkeypatch.setattr("os.sched_getaffinity", lambda pid, cores=cores: set(cores))
        cfg = compose("train", [f"data={option}", f"paths.output_dir={tmp_path}"])
        assert cfg.data.num_workers == workers


def cli_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.fixture
def start(tmp_path):
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_our_ckpt(tmp_path / "pre.ckpt", tok)
    train = write_csv(tmp_path / "train.csv", sentiment_rows(20))
    hydra = f"hydra.run.dir={tmp_path / 'h'}"
    return tmp_path, ["finetune", f"task.train_file={train}", hydra, "debug=tiny"]


@pytest.mark.parametrize(
    "ignored",
    [
        "model=bert_mini",
        "model.hidden_size=64",
        "data.tokenizer.path=TOK",
        "data.tokenizer.vocab_size=99",
        "data={tokenizer:{vocab_size:99}}",  # a parent's dictionary that sets it
    ],
)
def test_settings_of_a_random_start_are_refused_with_init_from(start, capsys, ignored):
    tmp_path, argv = start
    ignored = ignored.replace("TOK", str(tmp_path / "tokenizer.json"))
    err = cli_error(capsys, *argv, f"init_from={tmp_path / 'pre.ckpt'}", ignored)
    assert err == (
        f"error: {ignored}: init_from={tmp_path / 'pre.ckpt'} gives the encoder and its "
        "tokenizer (these shape a random start only); leave them out"
    )
    assert not (tmp_path / "h" / "results.json").exists()


def test_a_vocabulary_size_is_refused_with_a_given_tokenizer(start, capsys):
    tmp_path, argv = start
    tok = tmp_path / "tokenizer.json"
    err = cli_error(capsys, *argv, f"data.tokenizer.path={tok}", "data.tokenizer.vocab_size=99")
    assert err == (
        f"error: data.tokenizer.vocab_size=99: data.tokenizer.path={tok} is used as it is "
        "(the size of a tokenizer trained on the train file); leave it out"
    )


def test_a_tokenizer_given_as_a_dictionary_sets_its_path_not_a_vocabulary_size(start):
    """`data={tokenizer:{path:...}}` is `data.tokenizer.path=...`: the run reads it, and
    nothing it left out is refused as given."""
    tmp_path, argv = start
    tok = tmp_path / "tokenizer.json"
    main([*argv, f"data={{tokenizer:{{path:{tok}}}}}", "trainer.max_steps=1"])
    ckpt = read_checkpoint(tmp_path / "h" / "checkpoints" / "last.ckpt")
    assert ckpt.tokenizer.get_vocab() == load_tokenizer(tok).get_vocab()


def test_a_soft_label_weight_without_its_encoder_is_refused(start, capsys):
    tmp_path, argv = start
    err = cli_error(capsys, *argv, "soft_labels.weight=0.9")
    assert err == (
        "error: soft_labels.weight=0.9: weighs soft_labels.encoder's zero-shot scores, and no "
        "soft_labels.encoder is given; give one or leave the weight out"
    )


def test_split_fractions_of_parts_given_as_files_are_refused(start, capsys):
    """`task.split` cuts a missing validation or test file from the train file: with both
    files given it would cut nothing, and the rows would stay as the files have them."""
    tmp_path, argv = start
    files = [
        f"task.{k}_file={write_csv(tmp_path / f'{k}.csv', sentiment_rows(8))}"
        for k in ("validation", "test")
    ]
    err = cli_error(capsys, *argv, *files, "task.split.validation=0.5", "task.split.test=0.4")
    assert err == (
        "error: task.split.validation=0.5 task.split.test=0.4: task.validation_file and "
        "task.test_file given, task.train_file is not cut for them (the fractions are of a "
        "missing file's rows); leave them out"
    )


def test_a_monitor_with_no_value_at_any_validation_is_said(tmp_path, monkeypatch, caplog):
    """Lightning keeps a NaN score as -inf: the first checkpoint stays "best"; the run says the
    monitor had no value and `results.json` holds NaN, not -inf."""
    write_tokenizer(tmp_path / "tokenizer.json")
    train = write_csv(tmp_path / "train.csv", sentiment_rows(48))
    monkeypatch.setattr(
        metrics.MatthewsCorrCoef, "compute", lambda self: torch.tensor(float("nan"))
    )
    cfg = compose(
        "finetune",
        overrides(tmp_path, "seq_classification", f"task.train_file={train}", "task.monitor=mcc"),
    )
    with caplog.at_level(logging.WARNING):
        results = finetune(cfg)
    assert "val/mcc had no value at any validation (NaN): the checkpoint kept" in caplog.text
    assert math.isnan(results["best_val"]["val/mcc"])
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert math.isnan(saved["best_val"]["val/mcc"])


@pytest.mark.parametrize(
    "task, monitor, mode",
    [
        ("regression", "pearson", "max"),
        ("regression", "mse", "min"),
        ("seq_classification", "loss", "min"),
        ("ad_relevance", "ndcg@10", "max"),
    ],
)
def test_the_checkpoint_and_early_stopping_follow_the_monitors_direction(task, monitor, mode):
    cfg = compose("finetune", [f"task={task}", f"task.monitor={monitor}", "task.train_file=x"])
    callbacks = cfg.callbacks
    assert cfg.task.mode == callbacks.model_checkpoint.mode == callbacks.early_stopping.mode == mode


@pytest.mark.parametrize(
    "monitor, mode",
    [("val/loss", "min"), ("val/ppl", "min"), ("val/mlm_acc", "max"), ("null", "min")],
)
def test_pretrainings_best_checkpoint_follows_the_monitors_direction(monitor, mode):
    cfg = compose(overrides=[f"callbacks.model_checkpoint.monitor={monitor}"])
    assert cfg.callbacks.model_checkpoint.mode == mode


def test_validation_every_n_steps_counts_optimizer_steps_when_batches_accumulate(tmp_path):
    """`val_check_interval: 3` (debug=tiny's) with 2 batches a step: steps 3 and 6, as without
    accumulation (Lightning counts batches)."""
    pretrain_tiny(tmp_path, "trainer.accumulate_grad_batches=2")
    with open(tmp_path / "metrics.csv", newline="") as f:
        steps = [int(r["step"]) for r in csv.DictReader(f) if r["val/loss"]]
    assert steps == [0, 3, 6]
