import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from bert_lightning.checkpoint import load_hf_folder, read_checkpoint
from bert_lightning.cli import main
from bert_lightning.commands.export_hf import export_hf
from bert_lightning.config import compose
from bert_lightning.data.corpus import iter_documents
from bert_lightning.data.masking import picked_positions
from bert_lightning.data.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_wordpiece
from bert_lightning.errors import UserError
from bert_lightning.inference import cosines, embed_texts, load_embedder, load_finetuned
from bert_lightning.interop import export_hf_folder, hf_to_ours, load_into, ours_to_hf
from bert_lightning.model import BertConfig, BertForPreTraining
from bert_lightning.tasks.kinds import hf_head
from finetune_fixtures import (
    WORDS,
    finetuned_ckpt,
    our_scores,
    write_hf_folder,
    write_our_ckpt,
    write_tokenizer,
)
from helpers import TINY_BERT, tiny_overrides, write_corpus

transformers = pytest.importorskip("transformers")

TINY = dict(TINY_BERT, vocab_size=40, max_position_embeddings=64)


def hf_folder(tmp_path, legacy=False):
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY)).eval()
    hf.save_pretrained(tmp_path)
    words = SPECIAL_TOKENS + [chr(ord("a") + i) for i in range(26)] + [f"##{i}" for i in range(9)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    if legacy:  # an old TF-converted checkpoint: gamma/beta, .bin
        from safetensors.torch import load_file

        state = load_file(tmp_path / "model.safetensors")
        state = {k.replace("LayerNorm.weight", "LayerNorm.gamma"): v for k, v in state.items()}
        state = {k.replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in state.items()}
        (tmp_path / "model.safetensors").unlink()
        torch.save(state, tmp_path / "pytorch_model.bin")
    return hf


@pytest.mark.parametrize("legacy", [False, True])
def test_import_hf_folder_gives_same_logits(tmp_path, legacy):
    hf = hf_folder(tmp_path, legacy)
    ckpt = load_hf_folder(tmp_path)
    ours = BertForPreTraining(ckpt.config).eval()
    load_into(ours, ckpt.state_dict)
    ids = torch.randint(5, 40, (2, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    labels = torch.where(mask.bool(), ids, -100)
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask)
        out = ours(ids, attention_mask=mask, labels=labels, mlm_positions=picked_positions(labels))
    torch.testing.assert_close(
        out.mlm_logits[out.mlm_labels != -100],
        theirs.prediction_logits[mask.bool()],
        atol=1e-5,
        rtol=0,
    )
    assert ckpt.tokenizer.token_to_id("a") == 5


def test_key_map_round_trip(tmp_path):
    from safetensors.torch import load_file

    state = BertForPreTraining(BertConfig(**TINY)).state_dict()
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY))
    hf.save_pretrained(tmp_path)
    assert set(ours_to_hf(state)) == set(load_file(tmp_path / "model.safetensors"))
    assert set(hf_to_ours(ours_to_hf(state))) == set(state) - {"cls.predictions.decoder.weight"}


def test_fused_qkv_splits_and_joins_exactly():
    """`qkv`'s row blocks are HF's query, key and value, and the map is lossless both ways."""
    hf = transformers.BertForPreTraining(transformers.BertConfig(**TINY)).state_dict()
    ours = hf_to_ours(hf)
    layer = "bert.encoder.layer.1.attention.self"
    assert f"{layer}.query.weight" not in ours and ours[f"{layer}.qkv.weight"].shape == (96, 32)
    assert torch.equal(ours[f"{layer}.qkv.weight"][32:64], hf[f"{layer}.key.weight"])
    back = ours_to_hf(ours)
    assert set(back) == set(hf) - {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert all(torch.equal(back[k], hf[k]) for k in back)
    partial = {k: v for k, v in hf.items() if not k.startswith(f"{layer}.value")}
    with pytest.raises(UserError, match=f"{layer}.query.weight: the checkpoint lacks its key"):
        hf_to_ours(partial)


def test_load_into_refuses_misfits():
    model = BertForPreTraining(BertConfig(**TINY))
    with pytest.raises(KeyError, match="classifier.weight"):
        load_into(model, {"classifier.weight": torch.zeros(2, 32)})
    with pytest.raises(ValueError, match="cls.predictions.bias"):
        load_into(model, {"cls.predictions.bias": torch.zeros(7)})


def test_load_weights_takes_the_parts_asked_and_leaves_a_pooler_the_model_lacks(caplog):
    """The one load from a checkpoint: only the parts named, every tensor equal; a pooler the
    model was built without left out; a key of a named part with no place refused; a start
    (`load_start`) takes each part both have and leaves out the task head."""
    from dataclasses import replace as with_fields

    from bert_lightning.checkpoint import Checkpoint
    from bert_lightning.model import BertModel
    from bert_lightning.weights import ENCODER, PRETRAINED, load_start, load_weights

    config = BertConfig(**TINY)
    trained = BertForPreTraining(config).state_dict()  # (pooler, MLM and NSP heads)
    trained["classifier.weight"] = torch.ones(2, config.hidden_size)  # a task's head
    ckpt = Checkpoint(config, trained, None, {}, "trained.ckpt")
    holder = torch.nn.Module()
    holder.bert = BertModel(config, add_pooling_layer=False)
    loaded = load_weights(holder, ckpt, ENCODER)
    assert loaded and all(k.startswith("bert.") and "pooler" not in k for k in loaded)
    assert all(torch.equal(v, trained[k]) for k, v in holder.state_dict().items())
    with pytest.raises(KeyError, match="classifier.weight"):
        load_weights(BertForPreTraining(config), ckpt, ("bert.", "classifier."))
    mlm = BertForPreTraining(config)
    assert set(load_weights(mlm, ckpt, PRETRAINED)) == set(trained) - {"classifier.weight"}
    start = BertForPreTraining(with_fields(config, hidden_dropout_prob=0.0))
    with caplog.at_level("INFO", logger="bert_lightning.weights"):
        load_start(start, ckpt)
    assert all(torch.equal(v, trained[k]) for k, v in start.state_dict().items())
    assert "not used ['classifier']" in caplog.text


def test_a_checkpoint_of_ours_with_three_projections_still_reads(tmp_path, tiny_tokenizer):
    """A `.ckpt` written when query, key and value were apart reads into `qkv` unchanged."""
    config = BertConfig(**TINY | {"vocab_size": tiny_tokenizer.get_vocab_size()})
    state = BertForPreTraining(config).state_dict()
    tied = "cls.predictions.decoder.weight"
    old = ours_to_hf(state) | {tied: state[tied]}  # as Lightning saved it
    ckpt = {
        "hyper_parameters": {"config": asdict(config)},
        "state_dict": {f"model.{k}": v for k, v in old.items()},
        "tokenizer": tiny_tokenizer.to_str(),
    }
    torch.save(ckpt, tmp_path / "old.ckpt")
    read = read_checkpoint(tmp_path / "old.ckpt").state_dict
    key = "bert.encoder.layer.0.attention.self.qkv.weight"
    assert torch.equal(read[key], state[key]) and "query" not in " ".join(read)


def test_export_asks_the_task_for_its_head():
    """interop maps keys; which transformers class a fine-tuned head is (and whether there is
    one) its task says, from the config a checkpoint stores."""
    seq, token = "BertForSequenceClassification", "BertForTokenClassification"
    assert hf_head({"kind": "regression", "pooling": "cls"}) == (seq, "regression")
    assert hf_head({"kind": "token_classification"}) == (token, "single_label_classification")
    assert hf_head({"kind": "ad_relevance", "architecture": "cross_encoder"}) == (seq, None)
    with pytest.raises(UserError, match=r"^task.architecture=bi_encoder: no transformers class$"):
        hf_head({"kind": "ad_relevance", "architecture": "bi_encoder", "pooling": "mean"})


MEAN, STD = 128.86, 26.82  # the target scale
TEXTS = [
    "the movie was good",
    "a lovely film the cast was nice and the plot was great " * 3,
    "bob was in paris",
]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def hf_logits(folder, texts, truncation=False) -> torch.Tensor:
    """(N, L) `transformers`' BertForSequenceClassification logits of `texts`, each encoded by
    the folder's own tokenizer as `transformers` reads it."""
    model = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        return torch.cat(
            [model(**hf_tok(t, truncation=truncation, return_tensors="pt")).logits for t in texts]
        )


# --- row 6: export-hf of a regression model ---------------------------------------------------


def test_an_exported_regression_model_predicts_the_target_in_transformers(tmp_path, tok):
    """The target scale is folded into the classifier: `transformers`' logit is our score, on
    the target's scale; config.json records the scale; our own reading of the folder (and its
    export again) does not apply it twice."""
    scale = (f"task.target_mean={MEAN}", f"task.target_std={STD}")
    ckpt = finetuned_ckpt(tmp_path / "reg.ckpt", tok, "task=regression", *scale)
    with torch.no_grad():  # a head with a bias, as a trained one has
        state = torch.load(ckpt, weights_only=True)
        state["state_dict"]["model.classifier.bias"].fill_(0.3)
        torch.save(state, ckpt)
    out = export_hf(str(ckpt), str(tmp_path / "hf"))
    ours = our_scores(ckpt, TEXTS)  # (N,)
    assert ours.sub(MEAN).abs().min() > 1  # on the target's scale, not standardised
    theirs = hf_logits(out, TEXTS)[:, 0]
    torch.testing.assert_close(theirs, ours, atol=1e-5 * STD, rtol=0)
    cfg = json.loads((tmp_path / "hf/config.json").read_text())
    assert cfg["problem_type"] == "regression" and cfg["id2label"] == {"0": "LABEL_0"}
    assert cfg["target_scale"] == {"mean": MEAN, "std": STD, "folded_into_classifier": True}
    # transformers' pipeline applies no function to a regression head: our score again
    pipe = transformers.pipeline("text-classification", model=out, tokenizer=out)
    piped = [r["score"] for r in pipe(TEXTS, function_to_apply="none")]
    torch.testing.assert_close(torch.tensor(piped), ours, atol=1e-5 * STD, rtol=0)

    # ours of theirs: the encoder as it was; the folder exported again gives the same numbers
    back = read_checkpoint(out).state_dict
    for key, value in read_checkpoint(ckpt).state_dict.items():
        if key.startswith("bert."):
            assert torch.equal(back[key], value), key
    again = export_hf(str(out), str(tmp_path / "again"))
    torch.testing.assert_close(hf_logits(again, TEXTS)[:, 0], ours, atol=1e-5 * STD, rtol=0)
    again_cfg = json.loads((tmp_path / "again/config.json").read_text())
    assert {k: again_cfg[k] for k in ("problem_type", "target_scale", "id2label")} == {
        k: cfg[k] for k in ("problem_type", "target_scale", "id2label")
    }


def test_labels_of_a_classifier_survive_its_folder_exported_again(tmp_path, tok):
    labels = ["negative", "positive"]
    ckpt = finetuned_ckpt(tmp_path / "cls.ckpt", tok, f"task.labels=[{','.join(labels)}]")
    out = export_hf(str(ckpt), str(tmp_path / "hf"))
    again = export_hf(out, str(tmp_path / "again"))
    cfg = json.loads((tmp_path / "again/config.json").read_text())
    assert cfg["id2label"] == {"0": "negative", "1": "positive"}
    assert cfg["problem_type"] == "single_label_classification"
    probs = hf_logits(again, TEXTS).softmax(-1)[:, 1]  # the second label's probability
    torch.testing.assert_close(probs, our_scores(ckpt, TEXTS), atol=1e-5, rtol=0)


# --- row 12: init_from= our .ckpt with new words ----------------------------------------------


def test_new_words_from_our_pretraining_checkpoint_train(tmp_path):
    """Our .ckpt holds the tied decoder as a tensor of its own: it grows with the embeddings
    (the same rows), and the run trains."""
    from bert_lightning.training.pretrain import train

    run = tmp_path / "run"
    corpus = write_corpus(run / "corpus.jsonl")
    start_tok = train_wordpiece(lambda: iter_documents([str(corpus)]), vocab_size=300)
    start = write_our_ckpt(tmp_path / "start.ckpt", start_tok)
    assert "cls.predictions.decoder.weight" in read_checkpoint(tmp_path / "start.ckpt").state_dict
    steps = ("trainer.max_steps=2", "validate_before_fit=false")
    extend = (f"init_from={tmp_path / 'start.ckpt'}", "data.tokenizer.extend=10", *steps)
    train(compose(overrides=tiny_overrides(run, *extend)))
    new = load_tokenizer(run / "tokenizer.json")
    assert new.get_vocab_size() == start_tok.get_vocab_size() + 10
    ckpt = torch.load(run / "checkpoints/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 2
    emb = ckpt["state_dict"]["model.bert.embeddings.word_embeddings.weight"]  # (V, H)
    assert emb.shape[0] == 320  # 310 tokens, padded to a multiple of 64
    assert torch.equal(ckpt["state_dict"]["model.cls.predictions.decoder.weight"], emb)  # tied
    old = start["bert.embeddings.word_embeddings.weight"]
    assert (emb[: len(old)] - old).abs().max() < 0.05  # 2 small steps from the start


def test_the_grown_decoder_is_the_grown_embedding(tmp_path):
    from bert_lightning.weights import padded_vocab, with_new_words

    corpus = write_corpus(tmp_path / "corpus.jsonl")
    tok = train_wordpiece(lambda: iter_documents([str(corpus)]), vocab_size=300)
    write_our_ckpt(tmp_path / "start.ckpt", tok)
    from bert_lightning.data.tokenizer import extend_wordpiece

    new_tok, pieces = extend_wordpiece(tok, iter_documents([str(corpus)]), 3)
    grown = with_new_words(read_checkpoint(tmp_path / "start.ckpt"), new_tok, pieces)
    emb = grown.state_dict["bert.embeddings.word_embeddings.weight"]  # (V', H)
    assert emb.shape[0] == padded_vocab(new_tok.get_vocab_size()) == grown.config.vocab_size
    assert grown.state_dict["cls.predictions.decoder.weight"] is emb
    old = read_checkpoint(tmp_path / "start.ckpt").state_dict
    for word, ids in pieces.items():
        want = old["bert.embeddings.word_embeddings.weight"][ids].mean(0)
        torch.testing.assert_close(emb[new_tok.token_to_id(word)], want)
    model = BertForPreTraining(grown.config)
    from bert_lightning.weights import load_start

    load_start(model, grown)
    assert torch.equal(model.cls.predictions.decoder.weight, emb)


# --- row 14: embed of an export-onnx folder, both at their defaults ---------------------------


@pytest.fixture
def onnx_embedder(tmp_path, tok):
    """An HF folder, and its export-onnx folder at the command's defaults."""
    pytest.importorskip("onnxruntime")
    write_hf_folder(tmp_path / "hf", tok)
    main(["export-onnx", str(tmp_path / "hf"), str(tmp_path / "onnx")])
    return tmp_path / "hf", tmp_path / "onnx"


def test_embed_takes_the_pooling_the_export_recorded(tmp_path, onnx_embedder, capsys):
    hf, folder = onnx_embedder
    spec = json.loads((folder / "onnx.json").read_text())
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy")])
    want = embed_texts(*load_embedder(hf), TEXTS, spec["pooling"])  # (N, H)
    assert np.abs(np.load(tmp_path / "v.npy") - want.numpy()).max() <= 1e-4
    # asked for another pooling: one line saying what to do
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "w.npy"),
              "--pooling", "cls"])  # fmt: skip
    assert capsys.readouterr().err == (
        f"error: {folder}: exported with pooling mean; pooling cls needs an export with "
        "--pooling cls\n"
    )
    # the server's /embed too, for a request that names no pooling
    from bert_lightning.serving import Embed, EmbedRequest

    api = Embed(str(folder), 8, 0.0, 1)
    api.setup("cpu")
    reply = api.predict([api.decode_request(EmbedRequest(texts=TEXTS))])[0]
    assert reply.status == 200
    assert np.abs(np.array(reply.body["embeddings"]) - want.numpy()).max() <= 1e-4


def test_embed_truncates_where_the_export_truncates(tmp_path, tok):
    """An export's length is the length it embeds at by default; a longer one asked is refused
    rather than cut silently to the export's."""
    pytest.importorskip("onnxruntime")
    write_hf_folder(tmp_path / "hf", tok)
    folder = tmp_path / "onnx"
    main(["export-onnx", str(tmp_path / "hf"), str(folder), "--max-seq-length", "48"])
    _, onnx_tok = load_embedder(folder)
    assert onnx_tok.truncation["max_length"] == 48
    model, torch_tok = load_embedder(tmp_path / "hf", 48)
    want = embed_texts(model, torch_tok, TEXTS, "mean")
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    args = ["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy")]
    main([*args, "--pooling", "mean"])
    assert np.abs(np.load(tmp_path / "v.npy") - want.numpy()).max() <= 1e-4
    with pytest.raises(
        UserError, match=r"exported to truncate at 48; --max-seq-length 64 needs an export"
    ):
        load_embedder(folder, 64)


# --- the interop sweep: each value the model uses survives both ways --------------------------


def cased(tok):
    """`tok` with a cased BERT normalizer (no lowercasing, accents kept)."""
    from tokenizers import Tokenizer, normalizers

    out = Tokenizer.from_str(tok.to_str())
    out.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    return out


CASED_TEXTS = ["The Movie was GOOD", "Héllo Bob in Paris", "bob was in paris"]


def test_a_cased_tokenizer_exports_cased(tmp_path, tok):
    model = BertForPreTraining(BertConfig(vocab_size=tok.get_vocab_size(), **TINY_BERT))
    out = export_hf_folder(model.state_dict(), model.config, cased(tok), tmp_path / "hf")
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["do_lower_case"] is False and cfg["strip_accents"] is False
    bare = tmp_path / "bare"  # transformers builds its tokenizer from vocab.txt and the config
    bare.mkdir()
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        (bare / name).write_bytes((out / name).read_bytes())
    for folder in (out, bare):
        theirs = transformers.AutoTokenizer.from_pretrained(folder)
        for text in CASED_TEXTS:
            assert theirs(text)["input_ids"] == cased(tok).encode(text).ids, (folder, text)


def test_a_cased_hf_folder_with_vocab_txt_alone_reads_cased(tmp_path, tok):
    """`tokenizer_config.json`'s `do_lower_case` (and accents, Chinese characters) is how
    `transformers` builds a tokenizer from `vocab.txt`: ours reads it too."""
    write_hf_folder(tmp_path / "hf", tok)
    folder = tmp_path / "hf"
    (folder / "tokenizer.json").unlink()
    vocab = sorted(tok.get_vocab(), key=tok.get_vocab().get)
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": False})
    )
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    ours = load_hf_folder(folder).tokenizer
    for text in CASED_TEXTS:
        assert ours.encode(text).ids == theirs(text)["input_ids"], text
    assert ours.encode("The").ids != ours.encode("the").ids


def test_transformers_truncates_an_exported_model_as_it_was_fine_tuned(tmp_path, tok):
    """`model_max_length` is the length the model was fine-tuned on (what `score` truncates
    to), so `truncation=True` in transformers gives our score on a long text."""
    # fine-tuned at 32 word pieces
    ckpt = finetuned_ckpt(tmp_path / "cls.ckpt", tok, "task.labels=[negative,positive]")
    assert load_finetuned(ckpt).max_seq_length == 32
    out = export_hf(str(ckpt), str(tmp_path / "hf"))
    cfg = json.loads((tmp_path / "hf/tokenizer_config.json").read_text())
    assert cfg["model_max_length"] == 32
    long = [TEXTS[1] * 2]  # 60 words
    probs = hf_logits(out, long, truncation=True).softmax(-1)[:, 1]
    torch.testing.assert_close(probs, our_scores(ckpt, long), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "changes",
    [
        {"layer_norm_eps": 1e-5},
        {"hidden_act": "gelu_new"},
        {"type_vocab_size": 3},
        {"is_decoder": True},
    ],
    ids=["layer_norm_eps", "hidden_act", "type_vocab_size", "is_decoder"],
)
def test_config_fields_of_the_forward_pass_survive_both_ways(tmp_path, tok, changes):
    config = BertConfig(vocab_size=tok.get_vocab_size(), **TINY_BERT | changes)
    model = BertForPreTraining(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    out = export_hf_folder(model.state_dict(), config, tok, tmp_path / "hf")
    hf = transformers.BertForPreTraining.from_pretrained(out).eval()
    assert all(getattr(hf.config, k) == v for k, v in changes.items())
    back = load_hf_folder(out)
    assert all(getattr(back.config, k) == v for k, v in changes.items())
    ids = torch.randint(5, config.vocab_size, (2, 9))
    types = torch.randint(0, config.type_vocab_size, ids.shape)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        ours = model.bert(ids, types, mask).last_hidden_state  # (B, T, H)
        theirs = hf.bert(ids, token_type_ids=types, attention_mask=mask).last_hidden_state
    assert (ours - theirs)[mask.bool()].abs().max() <= 1e-5


def test_an_exported_relevance_model_scores_as_ours_in_transformers_pipeline(tmp_path, tok):
    """A one-output head whose score is the sigmoid of its logit: no `problem_type`, so the
    pipeline applies a sigmoid, as `score` does."""
    ckpt = finetuned_ckpt(tmp_path / "ads.ckpt", tok, "task=ad_relevance")
    out = export_hf(str(ckpt), str(tmp_path / "hf"))
    assert "problem_type" not in json.loads((tmp_path / "hf/config.json").read_text())
    pairs = [("drill", "a cordless drill"), ("the movie", TEXTS[1])]
    pipe = transformers.pipeline("text-classification", model=out, tokenizer=out)
    piped = [pipe({"text": q, "text_pair": a})["score"] for q, a in pairs]
    torch.testing.assert_close(torch.tensor(piped), our_scores(ckpt, pairs), atol=1e-5, rtol=0)


def test_an_untied_hf_decoder_is_refused(tmp_path):
    """We tie the MLM decoder to the embeddings; a folder whose decoder differs would load into
    another function: one line."""
    from safetensors.torch import load_file, save_file

    cfg = transformers.BertConfig(**TINY_BERT, vocab_size=40, tie_word_embeddings=False)
    transformers.BertForMaskedLM(cfg).save_pretrained(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    assert "cls.predictions.decoder.weight" in state
    save_file(state, tmp_path / "model.safetensors")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(35)]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    with pytest.raises(UserError, match=r"decoder.weight differs from .*word_embeddings"):
        load_hf_folder(tmp_path)


def test_an_onnx_regression_export_scores_on_the_target_scale(tmp_path, tok):
    pytest.importorskip("onnxruntime")
    scale = (f"task.target_mean={MEAN}", f"task.target_std={STD}")
    ckpt = finetuned_ckpt(tmp_path / "reg.ckpt", tok, "task=regression", *scale)
    main(["export-onnx", str(ckpt), str(tmp_path / "onnx")])
    ours = our_scores(ckpt, TEXTS)
    assert ours.sub(MEAN).abs().max() < 5 * STD and ours.sub(MEAN).abs().max() > 0
    torch.testing.assert_close(our_scores(tmp_path / "onnx", TEXTS), ours, atol=1e-4, rtol=0)


def test_a_pre_ln_model_exports_to_onnx_and_is_refused_by_export_hf(tmp_path, tok):
    pytest.importorskip("onnxruntime")
    write_our_ckpt(tmp_path / "pre.ckpt", tok, pre_layer_norm=True)
    with pytest.raises(UserError, match="pre_layer_norm=true"):
        export_hf(str(tmp_path / "pre.ckpt"), str(tmp_path / "hf"))
    main(["export-onnx", str(tmp_path / "pre.ckpt"), str(tmp_path / "onnx")])
    want = embed_texts(*load_embedder(tmp_path / "pre.ckpt"), TEXTS, "mean")
    got = embed_texts(*load_embedder(tmp_path / "onnx"), TEXTS, "mean")
    assert (got - want).abs().max() <= 1e-4


def test_relative_position_embeddings_are_refused(tmp_path, tok):
    write_hf_folder(tmp_path / "hf", tok)
    cfg = json.loads((tmp_path / "hf/config.json").read_text())
    cfg["position_embedding_type"] = "relative_key"
    (tmp_path / "hf/config.json").write_text(json.dumps(cfg))
    with pytest.raises(UserError, match="only absolute position embeddings"):
        load_hf_folder(tmp_path / "hf")


# --- a fine-tuned bi-encoder as a sentence-transformers model ---------------------------------


def bi_encoder_ckpt(path, tok, pooling="mean"):
    """A bi-encoder checkpoint as finetune.py writes it, its head moved off its start (20, -10)
    so that a head read back as the start would show."""
    ckpt = finetuned_ckpt(
        path, tok, "task=ad_relevance", "task.architecture=bi_encoder", f"task.pooling={pooling}"
    )
    raw = torch.load(ckpt, weights_only=True)
    raw["state_dict"]["model.classifier.weight"].fill_(7.5)
    raw["state_dict"]["model.classifier.bias"].fill_(-3.25)
    torch.save(raw, ckpt)
    return ckpt


def pairs_of_many_lengths(n=64) -> list[tuple[str, str]]:
    """`n` (query, ad) pairs of 1-4 and 1-9 words, each a token of the tiny tokenizer (no pair
    truncated): batches pad most of them."""
    words = WORDS
    rng = np.random.default_rng(0)
    pick = lambda k: " ".join(rng.choice(words, k))  # noqa: E731
    return [(pick(1 + i % 4), pick(1 + i % 9)) for i in range(n)]


@pytest.mark.parametrize("pooling", ["mean", "max"])
def test_a_bi_encoder_exports_as_a_sentence_transformers_model(tmp_path, tok, pooling):
    """sentence-transformers loads the folder; its vectors' cosines are the checkpoint's own, its
    vectors are `embed`'s of the folder, and `score` of the folder reads the head back."""
    st = pytest.importorskip("sentence_transformers")
    ckpt = bi_encoder_ckpt(tmp_path / "bi.ckpt", tok, pooling)
    folder = export_hf(str(ckpt), str(tmp_path / "st"))
    pairs = pairs_of_many_lengths()
    model = st.SentenceTransformer(folder, device="cpu")
    queries, ads = ([p[i] for p in pairs] for i in (0, 1))
    u, v = (model.encode(t, convert_to_tensor=True, batch_size=16) for t in (queries, ads))
    torch.testing.assert_close(u.norm(dim=-1), torch.ones(len(u)))  # Normalize: unit vectors
    ft = load_finetuned(ckpt)
    ours = cosines(ft.model, ft.tokenizer(), pairs)  # (64,)
    torch.testing.assert_close(st.util.pairwise_cos_sim(u, v), ours, atol=1e-5, rtol=0)
    embedder, embed_tok = load_embedder(folder)
    torch.testing.assert_close(embed_texts(embedder, embed_tok, queries), u, atol=1e-5, rtol=0)
    scores = our_scores(folder, pairs)
    torch.testing.assert_close(scores, our_scores(ckpt, pairs), atol=1e-6, rtol=0)
    torch.testing.assert_close(scores, torch.sigmoid(7.5 * ours - 3.25), atol=1e-6, rtol=0)
    again = export_hf(folder, str(tmp_path / "again"))  # the folder reads as its checkpoint
    for name in ("score_head.json", "modules.json", "1_Pooling/config.json"):
        assert (tmp_path / "again" / name).read_text() == (tmp_path / "st" / name).read_text()
    torch.testing.assert_close(our_scores(again, pairs), scores, atol=0, rtol=0)


def test_a_bi_encoder_pooled_by_the_pooler_is_refused_by_export_hf(tmp_path, tok):
    ckpt = bi_encoder_ckpt(tmp_path / "bi.ckpt", tok, "cls")
    with pytest.raises(UserError) as e:
        export_hf(str(ckpt), str(tmp_path / "st"))
    assert str(e.value) == (
        "task.pooling=cls: a bi-encoder pooled by BERT's pooler (dense + tanh) has no "
        "sentence-transformers Pooling mode; export-onnx exports it"
    )
    assert not (tmp_path / "st").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h: h.pop("classifier"), "no classifier; expected task, max_seq_length, classifier"),
        (
            lambda h: h["classifier"].update(weight="7.5"),
            "classifier.weight: expected float, got '7.5'",
        ),
        (
            lambda h: h["task"].update(architecture="cross_encoder"),
            "task kind='ad_relevance' architecture='cross_encoder'; a score head is a "
            "bi-encoder's (ad_relevance, bi_encoder)",
        ),
        (
            lambda h: h["task"].update(pooling="cls"),
            "task pooling='cls'; a bi-encoder's sentence-transformers folder pools by one of "
            "('mean', 'max') (BERT's pooler has no weights here)",
        ),
        (
            lambda h: h["classifier"].update(weight=float("nan")),
            "classifier {'weight': nan, 'bias': -3.25}: expected finite numbers",
        ),
    ],
    ids=["no head", "a string", "a cross-encoder", "the pooler", "not a number"],
)
def test_a_score_head_that_is_not_a_bi_encoders_is_one_line(tmp_path, tok, edit, message):
    folder = tmp_path / "st"
    export_hf(str(bi_encoder_ckpt(tmp_path / "bi.ckpt", tok)), str(folder))
    head = json.loads((folder / "score_head.json").read_text())
    edit(head)
    (folder / "score_head.json").write_text(json.dumps(head))
    with pytest.raises(UserError) as e:
        load_finetuned(folder)
    assert str(e.value) == f"{folder / 'score_head.json'}: {message}"


@pytest.mark.parametrize(
    ("name", "edit", "declared"),
    [
        ("sentence_bert_config.json", {"max_seq_length": 8}, "('mean', True, 8)"),
        ("1_Pooling/config.json", {"pooling_mode_mean_tokens": False,
                                   "pooling_mode_max_tokens": True}, "('max', True, 32)"),
    ],
    ids=["length", "pooling"],
)  # fmt: skip
def test_a_folder_whose_modules_contradict_its_head_is_refused(tmp_path, tok, name, edit, declared):
    """sentence-transformers reads the modules, `score` the head's record: a folder where they
    differ would give two models' numbers under one name."""
    folder = tmp_path / "st"
    export_hf(str(bi_encoder_ckpt(tmp_path / "bi.ckpt", tok)), str(folder))
    settings = json.loads((folder / name).read_text())
    (folder / name).write_text(json.dumps(settings | edit))
    with pytest.raises(UserError) as e:
        load_finetuned(folder)
    assert str(e.value) == (
        f"{folder / 'score_head.json'}: pooling, unit length, max_seq_length ('mean', True, 32); "
        f"the folder's sentence-transformers modules declare {declared}: sentence-transformers "
        "would compute other vectors than the head was trained on"
    )
