"""An ONNX folder pools as it was exported (`export-onnx --pooling mean`), in `embed` and in the
server's /embed alike, when the command or request names no pooling (PyTorch's default is
`cls`, so mean vectors show the export's own was used); another one asked is refused."""

import numpy as np
import pytest

from bert_lightning.cli import main
from bert_lightning.inference import EMBED_POOLING, embed_texts, load_embedder
from bert_lightning.onnx_export import export_onnx
from finetune_fixtures import write_hf_folder, write_tokenizer

pytest.importorskip("onnxruntime")
pytest.importorskip("litserve")
TEXTS = ["the cat sat on the mat", "a dog", "the cat sat on the mat by a dog in the sun"]


def test_embed_and_serve_pool_as_the_folder_was_exported(tmp_path):
    from bert_lightning.serving import Embed, EmbedRequest

    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    folder = export_onnx(
        tmp_path / "hf", tmp_path / "onnx", quantize=None, pooling="mean", max_seq_length=None,
        overwrite=False,
    )  # fmt: skip
    model, t = load_embedder(tmp_path / "hf")
    want = embed_texts(model, t, TEXTS, "mean").numpy()
    assert EMBED_POOLING != "mean"
    assert np.abs(embed_texts(model, t, TEXTS).numpy() - want).max() > 1e-2  # not cls's
    (tmp_path / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    main(["embed", str(folder), str(tmp_path / "texts.txt"), str(tmp_path / "v.npy")])
    assert np.abs(np.load(tmp_path / "v.npy") - want).max() <= 1e-4
    api = Embed(str(folder), 8, 0.0, 1)
    api.setup("cpu")
    asked = [EmbedRequest(texts=TEXTS), EmbedRequest(texts=TEXTS[:1], pooling="cls")]
    default, other = api.predict([api.decode_request(r) for r in asked])
    assert (
        default.status == 200 and np.abs(np.array(default.body["embeddings"]) - want).max() <= 1e-4
    )
    assert other.status == 400 and "exported with pooling mean" in other.body["error"]
