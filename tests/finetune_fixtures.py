"""Tiny task files, a tiny tokenizer and tiny checkpoints for the fine-tuning tests."""

from __future__ import annotations

import json
import random
import zipfile
from dataclasses import asdict, replace
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf
from safetensors.torch import save_file

from bert_lightning.checkpoint import write_model
from bert_lightning.config import compose
from bert_lightning.data.tokenizer import save_tokenizer, train_wordpiece
from bert_lightning.experiments.downstream import load_budget
from bert_lightning.interop import ours_to_hf
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.training.finetune_module import FinetuneModule
from helpers import TINY_BERT

GOOD = ["great", "good", "fine", "lovely", "nice"]
BAD = ["awful", "bad", "poor", "terrible", "ugly"]
NOUNS = ["movie", "film", "story", "plot", "cast", "show"]
WORDS = GOOD + BAD + NOUNS + ["the", "a", "was", "is", "paris", "london", "bob", "alice", "in"]


def tiny_config(vocab_size: int, layers: int = 2) -> BertConfig:
    shape = TINY_BERT | {"num_hidden_layers": layers}
    return BertConfig(**shape, vocab_size=vocab_size, max_position_embeddings=64)


def write_tokenizer(path: Path):
    texts = [" ".join(random.Random(i).choices(WORDS, k=8)) for i in range(200)]
    tok = train_wordpiece(lambda: iter(texts), vocab_size=120, min_frequency=1)
    save_tokenizer(tok, path)
    return tok


def write_our_ckpt(path: Path, tok, **changes) -> dict:
    """A `.ckpt` as train.py writes it (hyper_parameters, `model.`-prefixed state, tokenizer);
    `changes`: BertConfig fields other than the tiny config's."""
    config = replace(tiny_config(tok.get_vocab_size()), **changes)
    model = BertForPreTraining(config)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    write_model(
        path,
        {"config": asdict(config), "optim": {"lr": 1e-3}, "objective": "mlm"},
        state,
        tok.to_str(),
    )
    return model.state_dict()


def write_hf_folder(folder: Path, tok, layers: int = 2) -> dict:
    """config.json + model.safetensors (HF keys, with position_ids) + tokenizer.json."""
    folder.mkdir(parents=True, exist_ok=True)
    config = tiny_config(tok.get_vocab_size(), layers)
    model = BertForPreTraining(config)
    raw = ours_to_hf(model.bert.state_dict())  # as HF BertModel saves it: no `bert.` prefix
    raw["embeddings.position_ids"] = torch.arange(64)[None]
    save_file({k: v.contiguous() for k, v in raw.items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert", **asdict(config)}))
    tok.save(str(folder / "tokenizer.json"))
    return {f"bert.{k}": v for k, v in model.bert.state_dict().items()}


def sentiment_rows(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        adj = rng.choice(GOOD if label else BAD)
        rows.append({"sentence": f"the {rng.choice(NOUNS)} was {adj}", "label": label})
    return rows


def write_csv(path: Path, rows: list[dict], sep: str = ",") -> Path:
    keys = list(rows[0])
    lines = [sep.join(keys)] + [sep.join(str(r[k]) for k in keys) for r in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def ad_rows(n_queries: int = 8) -> list[dict]:
    rows = []
    for q in range(n_queries):
        noun = NOUNS[q % len(NOUNS)]
        for grade, adj in ((3, GOOD[q % 5]), (2, "the"), (1, BAD[q % 5])):
            ad = f"{adj} {noun}" if grade != 2 else f"a {NOUNS[(q + 1) % 6]}"
            rows.append({"query": f"{noun} {q}", "ad": ad, "label": grade})
    return rows


def regression_rows(n: int) -> list[dict]:
    return [
        {"text": f"the {NOUNS[i % 6]} " + " ".join(["good"] * (i % 4)), "target": float(i % 4)}
        for i in range(n)
    ]


CONLL = """-DOCSTART- O

bob\tB-person
was\tO
in\tO
paris\tB-location

alice\tB-person
alice\tI-person
is\tO
in\tO
london\tB-location

"""


def write_conll(path: Path, copies: int = 6) -> Path:
    path.write_text(CONLL * copies)
    return path


def write_dataset(folder: Path, name: str) -> Path:
    """Tiny files in the published format of a `conf/dataset/` preset, under the names it reads."""
    folder.mkdir(parents=True, exist_ok=True)
    if name == "home_depot":  # one Latin-1 CSV in a zip; header quoted, relevance in thirds
        lines = ['"id","product_uid","product_title","search_term","relevance"']
        for i, r in enumerate(ad_rows(12)):
            grade = {3: "3", 2: "2.33", 1: "1"}[r["label"]]
            lines.append(f"{i},{100 + i},{r['ad']} caf\xe9,{r['query']},{grade}")
        with zipfile.ZipFile(folder / "train.csv.zip", "w") as z:
            z.writestr("train.csv", ("\n".join(lines) + "\n").encode("latin-1"))
    elif name == "sst2":  # GLUE TSV with a header
        write_csv(folder / "train_full.tsv", sentiment_rows(48), sep="\t")
        write_csv(folder / "dev.tsv", sentiment_rows(16, seed=1), sep="\t")
    elif name == "cola":  # header-less: source, label, original label (empty), sentence
        for file, n, seed in (("in_domain_train.tsv", 48, 0), ("in_domain_dev.tsv", 16, 1)):
            rows = sentiment_rows(n, seed)
            (folder / file).write_text(
                "".join(f"gj04\t{r['label']}\t\t{r['sentence']}\n" for r in rows)
            )
    else:  # wnut17: CoNLL BIO
        write_conll(folder / "wnut17train.conll")
        write_conll(folder / "emerging.dev.conll", copies=2)
    return folder


def relevance_ckpt(tmp_path, tok):
    """A checkpoint as finetune.py writes it, with an untrained (random) head."""
    cfg = compose("finetune", ["task=ad_relevance", "task.train_file=x", "paths.output_dir=."])
    task = OmegaConf.to_container(cfg.task, resolve=True)
    module = FinetuneModule(
        asdict(tiny_config(tok.get_vocab_size())), task, {"lr": 1e-3}, False, tok.to_str()
    )
    path = tmp_path / "relevance.ckpt"
    write_model(path, dict(module.hparams), module.state_dict(), tok.to_str())
    return path, module.model.eval()


def our_scores(model_path, rows) -> torch.Tensor:
    """(N,) what `bert-lightning score` gives for `rows` (texts or (query, ad) pairs)."""
    from bert_lightning.inference import load_finetuned, score_rows

    ft = load_finetuned(model_path)
    return torch.tensor(score_rows(ft.model, ft.task, ft.tokenizer(), rows))


def finetuned_ckpt(path: Path, tok, *overrides: str) -> Path:
    """A checkpoint as finetune.py writes it (untrained head) of the task `overrides` make."""
    cfg = compose("finetune", ["task.train_file=x", "paths.output_dir=.", *overrides])
    module = FinetuneModule(
        asdict(tiny_config(tok.get_vocab_size())),
        OmegaConf.to_container(cfg.task, resolve=True),
        {},
        False,
        tok.to_str(),
        32,
    )
    write_model(path, dict(module.hparams), module.state_dict(), tok.to_str())
    return path


TINY_TASK = {
    "rows": 40,
    "validation_rows": 8,
    "test_rows": None,
    "epochs": 1,
    "lr": 1e-3,
    "max_seq_length": 32,
    "batch_size": 8,
}


def tiny_budget(path, base="cpu"):
    """A budget (`cpu`, `gpu` or a YAML) with every task cut to a few steps, on the CPU."""
    common, tasks = load_budget(base)
    common = [o.replace("accelerator=gpu", "accelerator=cpu") for o in common]
    raw = {"overrides": common, "tasks": {}}
    for name, t in tasks.items():
        raw["tasks"][name] = {**t.__dict__, **TINY_TASK, "overrides": list(t.overrides)}
        if t.dataset == "home_depot":  # whole queries of 3 rows
            raw["tasks"][name]["test_rows"] = 9
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def overrides(tmp_path, task, *extra):
    """A finetune.py run of `task` small enough for a unit test (debug=tiny), writing into
    tmp_path/run."""
    return [
        "debug=tiny",
        f"task={task}",
        f"paths.output_dir={tmp_path / 'run'}",
        f"data.tokenizer.path={tmp_path / 'tokenizer.json'}",
        *extra,
    ]


def task_files(tmp_path, task):
    """Tiny train (and dev) files of `task`, as its `task.*_file` overrides."""
    if task == "seq_classification":
        train = write_csv(tmp_path / "train.csv", sentiment_rows(48))
        return [f"task.train_file={train}"]
    if task == "regression":
        return [f"task.train_file={write_jsonl(tmp_path / 'train.jsonl', regression_rows(48))}"]
    if task == "ad_relevance":
        train = write_csv(tmp_path / "ads.tsv", ad_rows(12), sep="\t")
        # ranking: the pairwise loss, on batches of whole queries
        return [
            f"task.train_file={train}",
            "task.label_type=graded",
            "task.monitor=ndcg@10",
            "task.loss=pairwise",
        ]
    train = write_conll(tmp_path / "train.conll")
    dev = write_conll(tmp_path / "dev.conll", copies=2)
    return [f"task.train_file={train}", f"task.validation_file={dev}", f"task.test_file={dev}"]


def task_cfg(name, **kw):
    cfg = compose("finetune", [f"task={name}", "task.train_file=x", "paths.output_dir=."]).task
    return {**dict(cfg), "split": dict(cfg.split), "subsample": dict(cfg.subsample), **kw}


def cfg_for(task, train, **kw):
    return task_cfg(task, train_file=str(train), **kw)


def computed(task, logits, batch):
    metrics = task.metrics()
    task.update(metrics, logits, batch)
    return task.compute(metrics)
