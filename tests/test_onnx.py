"""`bert-lightning export-onnx` and its folder in score, embed, evaluate and serve: ONNX Runtime
gives PyTorch's outputs within 1e-4 (fp32) on padded batches of mixed lengths, int8 close to
them; every use of the folder is the checkpoint's use."""

import builtins
import json

import numpy as np
import pandas as pd
import pytest
import torch

from bert_lightning.cli import main
from bert_lightning.data.tables import collate
from bert_lightning.errors import UserError
from bert_lightning.inference import (
    embed_texts,
    load_embedder,
    load_finetuned,
    score_rows,
)
from bert_lightning.onnx_export import export_onnx
from bert_lightning.ort import INPUTS, spec_of
from bert_lightning.serving import Embed, PairsRequest, ScorePairs, endpoints
from finetune_fixtures import (
    ad_rows,
    finetuned_ckpt,
    write_csv,
    write_hf_folder,
    write_tokenizer,
)

pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

# rows of 6 to 40 words: every batch pads
ROWS = [
    {**r, "ad": " ".join([r["ad"]] * (1 + i % 5) * (1 + 2 * (i % 3)))}
    for i, r in enumerate(ad_rows(4))
]
TEXTS = [r["ad"] for r in ROWS]
ADS = ["task=ad_relevance", "task.label_type=graded"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def exported(ckpt, out, quantize=None, pooling=None):
    return export_onnx(
        ckpt, out, quantize=quantize, pooling=pooling, max_seq_length=None, overwrite=False
    )


@pytest.mark.parametrize(
    "overrides",
    [ADS, [*ADS, "task.architecture=bi_encoder"], ["task=token_classification"]],
    ids=["cross_encoder", "bi_encoder", "token_classification"],
)
def test_a_fine_tuned_model_gives_its_pytorch_outputs(tmp_path, tok, overrides):
    if overrides[0] == "task=token_classification":
        overrides = [*overrides, "task.labels=[O,B-person,I-person]"]
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, *overrides)
    folder = exported(ckpt, tmp_path / "onnx")
    ours, theirs = load_finetuned(ckpt), load_finetuned(folder)
    assert theirs.task.cfg == ours.task.cfg and theirs.max_seq_length == ours.max_seq_length
    pairs = [(r["query"], r["ad"]) for r in ROWS]
    lengths = set()
    tokenizer = ours.tokenizer()
    encodings, pad = tokenizer.encode_batch(pairs), tokenizer.token_to_id("[PAD]")
    for start in range(0, len(encodings), 5):  # in file order: batches of mixed lengths
        rows = encodings[start : start + 5]
        b = collate([{"input_ids": e.ids, "token_type_ids": e.type_ids} for e in rows], pad)
        lengths |= set(b["attention_mask"].sum(1).tolist())
        with torch.no_grad():
            want = ours.model(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        got = theirs.model(b["input_ids"], b["token_type_ids"], b["attention_mask"])
        real = b["attention_mask"].bool() if want.dim() == 3 else slice(None)  # tokens: not pads
        assert (got[real] - want[real]).abs().max() <= 1e-4
    assert len(lengths) > 4  # batches of mixed lengths
    spec = spec_of(folder)
    assert spec["use"] == "finetuned" and spec["task"]["kind"] == overrides[0].split("=")[1]
    one_text = "task.architecture=bi_encoder" in overrides  # no token types: not a graph input
    want_inputs = ["input_ids", "attention_mask"] if one_text else list(INPUTS)
    assert spec["inputs"] == want_inputs


def test_score_evaluate_and_serve_take_the_exported_folder(tmp_path, tok):
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, *ADS)
    folder = exported(ckpt, tmp_path / "onnx")
    write_csv(tmp_path / "rows.csv", ROWS)
    for model, name in ((ckpt, "torch"), (folder, "onnx")):
        main(["score", str(model), str(tmp_path / "rows.csv"), str(tmp_path / f"{name}.csv")])
        json_out = str(tmp_path / f"{name}.json")
        main(["evaluate", str(model), str(tmp_path / "rows.csv"), "--json", json_out])
    want, got = (pd.read_csv(tmp_path / f"{n}.csv")["score"] for n in ("torch", "onnx"))
    assert np.abs(got - want).max() <= 1e-4
    ran = [json.loads((tmp_path / f"{n}.json").read_text()) for n in ("torch", "onnx")]
    assert ran[1]["kind"] == "fine-tuning"
    assert ran[1]["metrics"]["auroc"] == pytest.approx(ran[0]["metrics"]["auroc"])
    routes = endpoints(str(folder))
    assert (
        routes["/score"] is ScorePairs and "needs an exported embedding model" in routes["/embed"]
    )
    assert "needs a checkpoint with an MLM head" in routes["/fill-mask"]
    api = ScorePairs(str(folder), 8, 0.0, 1)
    api.setup("cpu")
    pairs = [{"query": r["query"], "ad": r["ad"]} for r in ROWS]
    reply = api.predict([api.decode_request(PairsRequest(pairs=pairs))])[0]
    assert reply.status == 200 and np.abs(np.array(reply.body["scores"]) - want).max() <= 1e-4


def test_an_embedding_model_embeds_as_in_pytorch(tmp_path, tok):
    write_hf_folder(tmp_path / "hf", tok)
    for pooling in ("mean", "cls"):
        folder = exported(tmp_path / "hf", tmp_path / pooling, pooling=pooling)
        model, t = load_embedder(tmp_path / "hf")
        onnx_model, onnx_tok = load_embedder(folder)
        want = embed_texts(model, t, TEXTS, pooling, batch_size=3)
        got = embed_texts(onnx_model, onnx_tok, TEXTS, pooling, batch_size=3)
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-4
    assert embed_texts(onnx_model, onnx_tok, [], "cls").shape == (0, 32)
    with pytest.raises(UserError, match="exported with pooling cls; pooling mean needs an export"):
        embed_texts(onnx_model, onnx_tok, TEXTS, "mean")
    assert endpoints(str(folder))["/embed"] is Embed
    with pytest.raises(UserError, match="an exported embedding model; score needs a fine-tuned"):
        load_finetuned(folder)
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy")])
    assert np.abs(np.load(tmp_path / "v.npy") - want.numpy()).max() <= 1e-4


def test_int8_is_smaller_and_scores_near_fp32(tmp_path, tok):
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, *ADS)
    fp32, int8 = exported(ckpt, tmp_path / "fp32"), exported(ckpt, tmp_path / "int8", "int8")
    assert spec_of(int8)["quantized"] == "int8"
    assert (int8 / "model.onnx").stat().st_size < (fp32 / "model.onnx").stat().st_size
    pairs = [(r["query"], r["ad"]) for r in ROWS]
    a, b = load_finetuned(fp32), load_finetuned(int8)
    s32 = np.array(score_rows(a.model, a.task, a.tokenizer(), pairs))
    s8 = np.array(score_rows(b.model, b.task, b.tokenizer(), pairs))
    assert np.abs(s8 - s32).max() < 1e-3
    write_hf_folder(tmp_path / "hf", tok)
    vectors = [
        embed_texts(*load_embedder(exported(tmp_path / "hf", tmp_path / k, q)), TEXTS, "mean")
        for k, q in (("e32", None), ("e8", "int8"))
    ]
    assert torch.cosine_similarity(*vectors).min() > 0.99
    graph = onnx.load(tmp_path / "e8" / "model.onnx").graph
    tables = [i for i in graph.initializer if "embeddings" in i.name]
    assert tables and all(i.data_type == onnx.TensorProto.FLOAT for i in tables)  # not Gather
    scales = [i for i in graph.initializer if i.name.endswith("_scale") and i.dims]
    assert scales and all(i.dims[0] > 1 for i in scales)  # per output channel


@pytest.mark.parametrize("arch", ["cross_encoder", "bi_encoder"])
def test_fp32_top_keeps_the_top_layers_and_the_head_out_of_int8(tmp_path, tok, arch):
    """Of debug=tiny's 2 layers, `fp32_top=1` quantizes layer 0's Linear layers only; with both
    kept it scores as the fp32 export does (within ONNX Runtime's fp32 rounding)."""
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, *ADS, f"task.architecture={arch}")
    fp32 = exported(ckpt, tmp_path / "fp32")
    top = export_onnx(ckpt, tmp_path / "top", quantize="int8", pooling=None,
                      max_seq_length=None, overwrite=False, fp32_top=1)  # fmt: skip
    assert spec_of(top)["fp32_top"] == 1
    nodes = onnx.load(top / "model.onnx").graph.node
    plain = {n.name for n in nodes if n.op_type in ("MatMul", "Gemm") and "qkv" in n.name}
    assert [("layer.1" in n) for n in plain] == [True]  # layer 0's qkv is quantized
    assert any(n.op_type == "MatMulInteger" and "layer.0" in n.name for n in nodes)
    assert not any(n.op_type == "MatMulInteger" and "layer.1" in n.name for n in nodes)
    both = export_onnx(ckpt, tmp_path / "both", quantize="int8", pooling=None,
                       max_seq_length=None, overwrite=False, fp32_top=2)  # fmt: skip
    pairs = [(r["query"], r["ad"]) for r in ROWS]
    got = [load_finetuned(f) for f in (fp32, both)]
    s32, s_both = (np.array(score_rows(m.model, m.task, m.tokenizer(), pairs)) for m in got)
    assert np.abs(s_both - s32).max() < 1e-3  # all fp32; the quantizer's rewrite reorders sums
    for bad, why in ((3, "int8"), (1, None)):
        with pytest.raises(
            UserError,
            match=rf"^--fp32-top {bad}: needs --quantize int8 and at most the model's 2 layers$",
        ):
            export_onnx(ckpt, tmp_path / f"bad{bad}", quantize=why, pooling=None,
                        max_seq_length=None, overwrite=False, fp32_top=bad)  # fmt: skip


def test_export_refuses_an_existing_folder_and_says_what_to_install(tmp_path, tok, monkeypatch):
    ckpt = finetuned_ckpt(tmp_path / "ft.ckpt", tok, *ADS)
    (tmp_path / "taken").mkdir()
    with pytest.raises(UserError, match="taken exists; choose a new folder"):
        exported(ckpt, tmp_path / "taken")
    real = builtins.__import__

    def no_ort(name, *args, **kwargs):
        if name.startswith("onnxruntime"):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ort)
    with pytest.raises(UserError, match=r"pip install 'bert-lightning\[onnx\]'"):
        exported(ckpt, tmp_path / "new")
    assert not (tmp_path / "new").exists()
