"""`objective=distill`: each loss against a computation of its own on `transformers`' models,
zero for a student that is its teacher, the FLOP formula, a run whose losses fall while the
teacher stays as it was, a bitwise resume, and the student as an encoder like any other."""

import csv
import json
import logging
import math
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from bert_lightning.checkpoint import Checkpoint, read_checkpoint
from bert_lightning.config import compose
from bert_lightning.data.masking import picked_positions
from bert_lightning.errors import UserError
from bert_lightning.interop import hf_to_ours, ours_to_hf
from bert_lightning.model import BertConfig, distill_flops
from bert_lightning.model.distill import layer_map, principal_embeddings
from bert_lightning.training.distill_module import DistillModule
from bert_lightning.training.pretrain import build, train
from bert_lightning.weights import with_layers
from helpers import (
    OPTIM,
    RESUMABLE,
    ROOT,
    killed_and_resumed_bitwise,
    pretrain_tiny,
    tiny_overrides,
    write_corpus,
)

transformers = pytest.importorskip("transformers")

V = 97
TEACHER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
STUDENT = dict(hidden_size=16, num_hidden_layers=3, num_attention_heads=4, intermediate_size=32)
# no dropout; weights large enough for attention far from uniform
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=0.2)
ALL = dict(attention=1.0, value_relation=1.0, hidden=1.0, embedding=1.0, soft_mlm=1.0, mlm=1.0)
NONE = dict.fromkeys(ALL, 0.0)


def hf_model(shape: dict, state: dict | None = None):
    """transformers' BertForPreTraining with eager attention (its weights given to
    `output_attentions`), our state loaded when given."""
    config = transformers.BertConfig(
        vocab_size=V, max_position_embeddings=64, **shape, **NO_DROPOUT
    )
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    model = transformers.BertForPreTraining(config).eval()
    if state is not None:
        model.load_state_dict(ours_to_hf(state), strict=False)  # the decoder is re-tied
    return model


def teacher_ckpt(hf) -> Checkpoint:
    config = BertConfig(vocab_size=V, max_position_embeddings=64, **TEACHER, **NO_DROPOUT)
    return Checkpoint(config, hf_to_ours(hf.state_dict()), tokenizer=None, source="teacher")


def module(weights: dict, teacher, **kwargs) -> DistillModule:
    torch.manual_seed(2)
    student = BertConfig(vocab_size=V, max_position_embeddings=64, **STUDENT, **NO_DROPOUT)
    args = dict(temperature=2.0, relation_heads=None, student_layers=None)
    args |= dict(embeddings_from_teacher=False) | kwargs
    return DistillModule(
        asdict(student), OPTIM, "teacher", **weights, **args, nsp=False, teacher_ckpt=teacher
    ).eval()


def batch():
    """Three rows, two padded; a few positions picked and masked (id 4) as the collator does."""
    g = torch.Generator().manual_seed(5)
    B, T = 3, 10
    ids = torch.randint(5, V, (B, T), generator=g)
    mask = (torch.arange(T) < torch.tensor([10, 7, 4])[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    picked = torch.zeros(B, T, dtype=torch.bool)
    picked[0, [2, 5]] = picked[1, 3] = picked[2, 1] = True
    labels = torch.where(picked, ids, -100)
    return {
        "input_ids": ids.masked_fill(picked, 4),
        "labels": labels,
        "mlm_positions": picked_positions(labels),  # (B, T): room for every position
        "attention_mask": mask,
        "token_type_ids": torch.zeros_like(ids),
    }, ids


def kl_rows(p, q, keys, queries):
    """KL(p || q) of (B, h, T, T) attention-like rows: real keys summed, real queries and heads
    averaged."""
    terms = torch.where(keys[:, None, None, :], p * (p.log() - q.log()), 0.0).sum(-1)  # (B, h, T)
    return terms.masked_select(queries[:, None]).mean()


def value_relations(hf, hidden, mask, heads):
    """softmax(V V^T / sqrt(d)) of the last layer's values, re-split into `heads`."""
    v = hf.bert.encoder.layer[-1].attention.self.value(hidden)  # (B, T, H)
    v = v.unflatten(-1, (heads, -1)).transpose(1, 2)  # (B, heads, T, d)
    s = v @ v.transpose(-1, -2) / math.sqrt(v.size(-1))
    return s.masked_fill(~mask[:, None, None, :].bool(), -1e9).softmax(-1)


def mean_pool(h, mask):
    m = mask[..., None].float()
    return (h * m).sum(1) / m.sum(1)


def test_each_loss_equals_a_computation_on_transformers_models():
    hf_t = hf_model(TEACHER)
    m = module(ALL, teacher_ckpt(hf_t))
    hf_s = hf_model(STUDENT, m.model.state_dict())
    b, original = batch()
    with torch.no_grad():
        ours = m(b)  # MLM losses on: both read the masked text
    am, tokens, picked = b["attention_mask"], b["attention_mask"].bool(), b["labels"] != -100
    run = dict(attention_mask=am, output_attentions=True, output_hidden_states=True)
    with torch.no_grad():
        t, s = hf_t(b["input_ids"], **run), hf_s(b["input_ids"], **run)
        expected = {
            "attention": kl_rows(t.attentions[-1], s.attentions[-1], tokens, tokens),
            "value_relation": kl_rows(
                value_relations(hf_t, t.hidden_states[-2], am, 4),
                value_relations(hf_s, s.hidden_states[-2], am, 4),
                tokens,
                tokens,
            ),
            "hidden": torch.stack(
                [
                    (
                        (
                            s.hidden_states[i] @ m.projections["hidden"].weight.T
                            - t.hidden_states[j]
                        )[tokens]
                    )
                    .pow(2)
                    .mean()
                    for i, j in [(0, 0), (1, 1), (2, 1), (3, 2)]
                ]
            ).mean(),
            "embedding": 1
            - F.cosine_similarity(
                mean_pool(s.hidden_states[-1], am) @ m.projections["embedding"].weight.T,
                mean_pool(t.hidden_states[-1], am),
            ).mean(),
            "mlm": F.cross_entropy(s.prediction_logits[picked], b["labels"][picked]),
        }
        pt = (t.prediction_logits[picked] / 2).softmax(-1)
        ps = (s.prediction_logits[picked] / 2).softmax(-1)
        expected["soft_mlm"] = (pt * (pt.log() - ps.log())).sum(-1).mean() * 4
    assert layer_map(3, 2) == [(0, 0), (1, 1), (2, 1), (3, 2)]
    for k, v in expected.items():
        assert ours[k].item() == pytest.approx(v.item(), rel=1e-4, abs=1e-6), k
    assert ours["loss"].item() == pytest.approx(sum(v.item() for v in expected.values()), rel=1e-4)

    # without an MLM loss the models read the original text, not the masked one
    m.weights = dict(ALL, soft_mlm=0.0, mlm=0.0)
    with torch.no_grad():
        unmasked = m(b)
        t = hf_t(original, **run)
        s = hf_s(original, **run)
    want = kl_rows(t.attentions[-1], s.attentions[-1], tokens, tokens)
    assert unmasked["attention"].item() == pytest.approx(want.item(), rel=1e-4)


def test_a_student_that_is_its_teacher_has_zero_losses_but_mlm():
    hf_t = hf_model(TEACHER)
    t = teacher_ckpt(hf_t)
    student = with_layers(t, [0, 1])
    args = dict(temperature=2.0, relation_heads=None, student_layers=[0, 1])
    args |= dict(embeddings_from_teacher=False)
    m = DistillModule(
        asdict(student.config), OPTIM, "teacher", **ALL, **args, nsp=False, teacher_ckpt=t
    )
    m.eval()
    m.model.load_state_dict(student.state_dict, strict=False)
    with torch.no_grad():
        out = m(batch()[0])
    for k in ("attention", "value_relation", "hidden", "embedding", "soft_mlm"):
        assert out[k].item() == pytest.approx(0.0, abs=1e-6), k
    assert out["mlm"].item() > 1.0


def test_the_layers_of_a_teacher_start_a_student_renumbered():
    t = teacher_ckpt(hf_model(TEACHER))
    s = with_layers(t, [1])
    assert s.config.num_hidden_layers == 1
    for k, v in s.state_dict.items():
        source = k.replace("encoder.layer.0.", "encoder.layer.1.")
        assert torch.equal(v, t.state_dict[source]), k
    assert not any("layer.1." in k for k in s.state_dict)
    with pytest.raises(UserError, match=r"layers \[1, 1\]; expected distinct indices"):
        with_layers(t, [1, 1])


def test_principal_embeddings_keep_most_of_the_teachers_word_geometry():
    t = teacher_ckpt(hf_model(TEACHER)).state_dict
    word = t["bert.embeddings.word_embeddings.weight"]  # (V, 32)
    full = principal_embeddings(t, 32)  # a rotation: the tokens' dot products kept
    got = full["bert.embeddings.word_embeddings.weight"]
    torch.testing.assert_close(got @ got.T, word @ word.T, atol=1e-4, rtol=1e-4)
    eight = principal_embeddings(t, 8)
    assert {k: tuple(v.shape) for k, v in eight.items()} == {
        "bert.embeddings.word_embeddings.weight": (V, 8),
        "bert.embeddings.position_embeddings.weight": (64, 8),
        "bert.embeddings.token_type_embeddings.weight": (2, 8),
    }
    kept = eight["bert.embeddings.word_embeddings.weight"].var(0).sum()
    sigma = torch.linalg.svdvals(word - word.mean(0))
    torch.testing.assert_close(kept, (sigma[:8] ** 2).sum() / (V - 1), rtol=1e-4, atol=0)
    q, _ = torch.linalg.qr(torch.randn(32, 8, generator=torch.Generator().manual_seed(0)))
    assert kept > 1.5 * (word @ q).var(0).sum()  # more than any direction picked at random
    with pytest.raises(UserError, match="the student's width 48 must be at most the teacher's 32"):
        principal_embeddings(t, 48)


@pytest.mark.parametrize(
    "weights",
    [
        dict(NONE, attention=1.0, value_relation=1.0),  # the last layer on [CLS] alone
        ALL,
        dict(NONE, hidden=1.0, soft_mlm=1.0),
    ],
)
def test_distill_flops_match_torch_flop_counter(weights):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    m = module(weights, teacher_ckpt(hf_model(TEACHER))).train()
    b, _ = batch()
    # SDPA's math path: matmuls the counter sees (it has no formula for the CPU's fused kernel)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        m(b)["loss"].backward()
    tokens = int(b["attention_mask"].sum())
    # `mlm_positions` with room for every position: the heads run on B x T, of which P picked
    ran = distill_flops(m.model.config, m.teacher.config, 3, 10, 3 * 10, m.weights, tokens)
    assert ran == counter.get_total_flops()
    P = int((b["labels"] != -100).sum())
    useful = distill_flops(m.model.config, m.teacher.config, 3, 10, P, m.weights, tokens)
    assert m.flops_per_batch(b) == useful


def test_what_no_loss_reaches_is_frozen():
    m = module(dict(NONE, attention=1.0), teacher_ckpt(hf_model(TEACHER))).train()
    m(batch()[0])["loss"].backward()
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    no_grad = {n for n, p in m.named_parameters() if p.requires_grad and p.grad is None}
    assert not no_grad  # DDP needs every trainable parameter to get a gradient
    assert "model.bert.encoder.layer.2.intermediate.dense.weight" not in trainable
    assert "model.bert.encoder.layer.2.attention.self.qkv.weight" in trainable
    assert not any(n.startswith("teacher") for n, _ in m.named_parameters())
    assert not any(p.requires_grad for p in m.teacher.parameters())


def val_rows(n=11):
    """`n` rows of 3 to 10 tokens, 0 to 3 of them picked (id 4 where masked), lengths and picks
    uneven so that batches differ in each loss's count."""
    g = torch.Generator().manual_seed(7)
    out = []
    for i in range(n):
        T = 3 + i * 5 % 8
        ids = torch.randint(5, V, (T,), generator=g)
        picked = torch.zeros(T, dtype=torch.bool)
        picked[torch.randperm(T, generator=g)[: i % 4]] = True
        out.append((ids.masked_fill(picked, 4), torch.where(picked, ids, -100)))
    return out


def padded(rows):
    """A batch of `rows`, padded to its longest as the collator does."""
    T = max(len(ids) for ids, _ in rows)
    pad = lambda x, v: F.pad(x, (0, T - len(x)), value=v)  # noqa: E731
    ids = torch.stack([pad(x, 0) for x, _ in rows])  # (B, T)
    labels = torch.stack([pad(y, -100) for _, y in rows])  # (B, T)
    return {
        "input_ids": ids,
        "labels": labels,
        "mlm_positions": picked_positions(labels),  # (B, T)
        "attention_mask": torch.stack([pad(torch.ones_like(x), 0) for x, _ in rows]),  # (B, T)
        "token_type_ids": torch.zeros_like(ids),
    }


def test_the_validation_losses_are_the_whole_sets_however_rows_are_batched():
    """Each term, and `val/loss`, averaged over every unit of the set it is a mean of (real
    tokens, rows, picked positions), not over batches: batches of 5, 3 and 11 rows give the
    losses of the 11 rows as one batch."""
    import lightning as L
    from torch.utils.data import DataLoader

    m = module(ALL, teacher_ckpt(hf_model(TEACHER)))
    rows = val_rows()
    with torch.no_grad():
        want = {f"val/{k}": v.item() for k, v in m(padded(rows)).items()}
    quiet = dict(enable_progress_bar=False, enable_model_summary=False, logger=False)
    trainer = L.Trainer(accelerator="cpu", enable_checkpointing=False, **quiet)
    for size in (5, 3, len(rows)):
        data = DataLoader(rows, batch_size=size, collate_fn=padded)
        logged = trainer.validate(m, data, verbose=False)[0]  # and the step, epoch
        got = {k: float(v) for k, v in logged.items() if k.startswith("val/")}
        assert got == pytest.approx(want, abs=1e-5), size


def test_mistakes_are_one_line(tmp_path):
    hf_encoder_only = teacher_ckpt(hf_model(TEACHER))
    hf_encoder_only.state_dict = {
        k: v for k, v in hf_encoder_only.state_dict.items() if k.startswith("bert.")
    }
    with pytest.raises(UserError, match=r"objective.soft_mlm=1.0: teacher has no MLM head"):
        module(dict(NONE, soft_mlm=1.0), hf_encoder_only)
    with pytest.raises(UserError, match="every loss weight is 0"):
        module(NONE, hf_encoder_only)
    with pytest.raises(
        UserError, match=r"relation_heads=3 must divide both widths \(student 16, teacher 32\)"
    ):
        module(dict(NONE, attention=1.0), hf_encoder_only, relation_heads=3)
    m = module(dict(NONE, attention=1.0), hf_encoder_only)
    m._device_mesh = "a mesh"  # what Lightning's ModelParallelStrategy (trainer=fsdp) sets
    with pytest.raises(UserError, match=r"objective=distill runs with DDP \(trainer=ddp\), not"):
        m.configure_model()


# --- runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    """A 6-step tiny pretraining run: a teacher with an MLM head, its tokenizer."""
    out = tmp_path_factory.mktemp("teacher")
    pretrain_tiny(out)
    return out / "checkpoints" / "last.ckpt"


def distill_overrides(out, teacher, *extra):
    write_corpus(out / "corpus.jsonl")
    return tiny_overrides(
        out,
        "objective=distill",
        f"objective.teacher={teacher}",
        "objective.hidden=1.0",
        "objective.embedding=1.0",
        "objective.soft_mlm=1.0",
        "model.hidden_size=16",  # narrower than the teacher's 32
        "model.intermediate_size=32",
        *extra,
    )


def rows(out_dir):
    with open(out_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_a_30_step_run_lowers_every_loss_and_leaves_the_teacher_as_it_was(tmp_path, teacher_run):
    cfg = compose(overrides=distill_overrides(tmp_path, teacher_run, "trainer.max_steps=30"))
    dm, m, trainer = build(cfg)
    before = {k: v.clone() for k, v in m.teacher.state_dict().items()}
    trainer.fit(m, datamodule=dm)
    assert not m.teacher.training
    for k, v in m.teacher.state_dict().items():
        assert torch.equal(v, before[k]), k
    train_rows = [r for r in rows(tmp_path) if r.get("train/loss")]
    assert len(train_rows) == 30
    for key in ("loss", "attention", "hidden", "embedding", "soft_mlm"):
        x = [float(r[f"train/{key}"]) for r in train_rows]
        assert sum(x[-5:]) < sum(x[:5]), key
    # a barely trained teacher's values are near 0, their relations near uniform: nothing to
    # learn there from the first step
    assert all(float(r["train/value_relation"]) < 1e-3 for r in train_rows)
    assert any(r.get("train/flops_per_s") for r in rows(tmp_path))
    state = torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)["state_dict"]
    assert not any(k.startswith("teacher") for k in state)  # the teacher is not saved


@pytest.mark.slow
def test_a_distillation_resumes_bitwise(tmp_path, teacher_run):
    also = ("objective.mlm=0.5", "objective.relation_heads=4")  # every option steps somewhere

    def run(name, *extra):
        out = tmp_path / name
        train(compose(overrides=distill_overrides(out, teacher_run, *RESUMABLE, *also, *extra)))
        return out / "checkpoints/last.ckpt"

    resumed = killed_and_resumed_bitwise(run)
    with pytest.raises(UserError, match="trained with objective=distill from teacher"):
        pretrain_tiny(tmp_path / "mlm", "trainer.max_steps=10", f"ckpt_path={resumed}")


@pytest.mark.slow
def test_a_student_from_the_teachers_layers_exports_and_fine_tunes(tmp_path, teacher_run):
    from bert_lightning.training.finetune import finetune
    from finetune_fixtures import sentiment_rows, write_csv

    out = tmp_path / "student"
    overrides = distill_overrides(out, teacher_run, "objective.student_layers=[1]")
    overrides = [o for o in overrides if not o.startswith("model.")]  # the teacher's width
    train(compose(overrides=overrides))
    ckpt = out / "checkpoints" / "last.ckpt"
    student, teacher = read_checkpoint(ckpt), read_checkpoint(teacher_run)
    assert student.config.num_hidden_layers == 1 and student.origin == "pretraining"
    assert student.hparams["objective"] == "distill"
    assert student.tokenizer.get_vocab() == teacher.tokenizer.get_vocab()
    assert all(k.startswith(("bert.", "cls.")) for k in student.state_dict)
    assert "cls.predictions.bias" in student.state_dict  # soft_mlm trained the MLM head

    hf = tmp_path / "hf"
    subprocess.run(
        [sys.executable, "-m", "bert_lightning", "export-hf", str(ckpt), str(hf)], check=True
    )
    _, info = transformers.BertForPreTraining.from_pretrained(hf, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]

    write_csv(tmp_path / "train.csv", sentiment_rows(48))
    results = finetune(
        compose(
            "finetune",
            [
                "debug=tiny",
                f"paths.output_dir={tmp_path / 'ft'}",
                f"init_from={ckpt}",
                f"task.train_file={tmp_path / 'train.csv'}",
                "trainer.max_steps=3",
            ],
        )
    )
    assert results["init_from"] == f"checkpoint {ckpt}"


def test_a_student_starts_from_its_teachers_principal_embeddings_and_trains(
    tmp_path, teacher_run, caplog
):
    option = "objective.embeddings_from_teacher=true"
    overrides = distill_overrides(tmp_path, teacher_run, option, "trainer.max_steps=3")
    with caplog.at_level(logging.INFO):
        dm, m, trainer = build(compose(overrides=overrides))
    teacher = f"checkpoint {teacher_run}"
    assert (
        f"the run starts from weights: {teacher}'s embeddings on 16 principal directions; "
        f"tokenizer: {teacher}; shape: the model config (" in caplog.text
    )
    start = principal_embeddings(read_checkpoint(teacher_run).state_dict, 16)
    for k, v in start.items():
        assert torch.equal(m.model.state_dict()[k], v), k
    trainer.fit(m, datamodule=dm)
    assert len([r for r in rows(tmp_path) if r.get("train/loss")]) == 3
    with pytest.raises(
        UserError,
        match="objective.student_layers and objective.embeddings_from_teacher each start the "
        "student; give one",
    ):
        build(compose(overrides=[*overrides, "objective.student_layers=[1]"]))


def test_a_student_reads_its_teachers_tokenizer(tmp_path, teacher_run):
    from finetune_fixtures import write_our_ckpt, write_tokenizer

    other, tok = tmp_path / "other.ckpt", tmp_path / "tok.json"
    write_our_ckpt(other, write_tokenizer(tok))
    cfg = compose(overrides=distill_overrides(tmp_path, teacher_run, f"init_from={other}"))
    with pytest.raises(
        UserError,
        match=f"init_from={other} and objective.teacher=.* have "
        "different vocabularies; expected one tokenizer",
    ):
        build(cfg)
    cfg = compose(overrides=distill_overrides(tmp_path, teacher_run, f"data.tokenizer.path={tok}"))
    with pytest.raises(
        UserError,
        match=f"checkpoint {teacher_run} and data.tokenizer.path={tok} have different",
    ):
        build(cfg)


@pytest.mark.slow
def test_a_student_without_an_mlm_loss_is_an_encoder_without_heads(tmp_path, teacher_run):
    out = tmp_path / "student"
    train(compose(overrides=distill_overrides(out, teacher_run, "objective.soft_mlm=0.0")))
    ckpt = out / "checkpoints" / "last.ckpt"
    assert all(k.startswith("bert.") for k in read_checkpoint(ckpt).state_dict)
    hf = tmp_path / "hf"
    subprocess.run(
        [sys.executable, "-m", "bert_lightning", "export-hf", str(ckpt), str(hf)], check=True
    )
    _, info = transformers.BertModel.from_pretrained(hf, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    r = subprocess.run(
        [sys.executable, "-m", "bert_lightning", "fill-mask", str(ckpt), "the [MASK] sat"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"error: {ckpt}: no MLM head (cls.predictions.*) in these weights; fill-mask needs one"
    )


def test_the_distillation_tables_in_the_docs_are_what_the_kept_cells_give():
    """docs/pretraining-results.md's distillation tables: the ablation's SST-2, Home Depot and
    average, and the 30-minute, GPU and teacher rows of every task, are the suite's own, kept
    in bench/results/distill_*/downstream.json."""
    doc = (ROOT / "docs/pretraining-results.md").read_text()
    kept = json.loads((ROOT / "bench/results/distill_ablation/downstream.json").read_text())
    for name, m in kept["models"].items():
        row = [m["mean_std"]["sst2"][0], m["mean_std"]["home_depot"][0], m["average"][0]]
        assert "| " + " | ".join(f"{v:.3f}" for v in row) + " |" in doc, name
    kept = json.loads((ROOT / "bench/results/distill_30min/downstream.json").read_text())
    for name, m in kept["models"].items():
        cells = [*(m["mean_std"][t] for t in kept["tasks"]), m["average"]]
        assert "| " + " | ".join(f"{a:.3f} ± {b:.3f}" for a, b in cells) + " |" in doc, name
    kept = json.loads((ROOT / "bench/results/distill_gpu/downstream.json").read_text())
    for name, m in kept["models"].items():
        cells = [*(m["mean_std"][t] for t in kept["tasks"]), m["average"]]
        assert "| " + " | ".join(f"{a:.3f} ± {b:.3f}" for a, b in cells) + " |" in doc, name
    for folder, name in (
        ("distill_30min_pca", "distill_30min_pca"),
        ("distill_teacher", "teacher"),
    ):
        kept = json.loads((ROOT / f"bench/results/{folder}/downstream.json").read_text())
        m = kept["models"][name]  # one seed
        cells = [*(m["mean_std"][t][0] for t in kept["tasks"]), m["average"][0]]
        assert "| " + " | ".join(f"{v:.3f}" for v in cells) + " |" in doc, name
