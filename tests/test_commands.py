"""`bert-lightning score | fill-mask | embed` on tiny models."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.cli import main
from bert_lightning.commands.embed import embed, read_texts
from bert_lightning.commands.fill_mask import fill_mask
from bert_lightning.data.masking import picked_positions
from bert_lightning.data.tables import DataError
from bert_lightning.model import BertForPreTraining
from finetune_fixtures import (
    ad_rows,
    relevance_ckpt,
    tiny_config,
    write_csv,
    write_hf_folder,
    write_jsonl,
    write_our_ckpt,
    write_tokenizer,
)


@pytest.fixture
def tok(tmp_path):
    return write_tokenizer(tmp_path / "tokenizer.json")


def test_score_writes_the_input_with_a_score_column(tmp_path, tok):
    ckpt, model = relevance_ckpt(tmp_path, tok)
    rows = ad_rows(3)
    src = write_csv(tmp_path / "pairs.csv", rows)
    main(["score", str(ckpt), str(src), str(tmp_path / "scored.jsonl"), "--batch-size", "4"])
    out = pd.read_json(tmp_path / "scored.jsonl", lines=True)
    assert list(out.columns) == ["query", "ad", "label", "score"] and len(out) == len(rows)
    for r, got in zip(rows, out["score"], strict=True):  # one row at a time, no padding
        enc = tok.encode(r["query"], r["ad"])
        with torch.no_grad():
            logit = model(torch.tensor([enc.ids]), torch.tensor([enc.type_ids]), None)
        assert got == pytest.approx(torch.sigmoid(logit).item(), abs=1e-5)
    with pytest.raises(ValueError, match=r"pairs\.csv: no column 'title'"):
        main(
            [
                "--debug",
                "score",
                str(ckpt),
                str(src),
                str(tmp_path / "x.csv"),
                "--column",
                "ad=title",
            ]
        )


def test_fill_mask_gives_the_mlm_head_probabilities(tmp_path, tok):
    state = write_our_ckpt(tmp_path / "pre.ckpt", tok)
    model = BertForPreTraining(tiny_config(tok.get_vocab_size())).eval()
    model.load_state_dict(state)
    text = "the [MASK] was [MASK]"
    (masks,) = fill_mask(tmp_path / "pre.ckpt", [text], top_k=3)
    assert len(masks) == 2 and all(len(m) == 3 for m in masks)
    ids = torch.tensor([tok.encode(text).ids])
    labels = torch.where(ids == tok.token_to_id("[MASK]"), ids, -100)
    with torch.no_grad():
        out = model(ids, labels=labels, mlm_positions=picked_positions(labels))
        probs = out.mlm_logits[out.mlm_labels != -100].softmax(-1)  # (2, V)
    for m, p in zip(masks, probs, strict=True):
        top = p.topk(3)
        assert [e["token"] for e in m] == [tok.id_to_token(i) for i in top.indices.tolist()]
        assert [e["prob"] for e in m] == pytest.approx(top.values.tolist(), abs=1e-6)
    write_hf_folder(tmp_path / "hf", tok)  # encoder only, like all-MiniLM-L6-v2
    with pytest.raises(ValueError, match="no MLM head"):
        fill_mask(tmp_path / "hf", [text])


def test_embed_pools_and_ignores_padding(tmp_path, tok):
    write_hf_folder(tmp_path / "hf", tok, layers=4)
    texts = ["the film", "a lovely story was the plot of the show", "bob"]
    pre = read_checkpoint(tmp_path / "hf")
    model = BertForPreTraining(pre.config).bert.eval()
    model.load_state_dict({k[5:]: v for k, v in pre.state_dict.items()}, strict=False)
    for pooling, width in (("cls", 32), ("mean", 32), ("max", 32), ("last4", 128)):
        batched = embed(tmp_path / "hf", texts, pooling, batch_size=3)
        single = np.concatenate([embed(tmp_path / "hf", [t], pooling) for t in texts])
        assert batched.shape == (3, width)
        np.testing.assert_allclose(batched, single, atol=1e-5)
    with torch.no_grad():
        h = model(torch.tensor([tok.encode(texts[1]).ids])).last_hidden_state[0]  # (T, H)
    np.testing.assert_allclose(embed(tmp_path / "hf", texts, "mean")[1], h.mean(0), atol=1e-5)
    np.testing.assert_allclose(embed(tmp_path / "hf", texts, "max")[1], h.amax(0), atol=1e-5)
    write_hf_folder(tmp_path / "hf2", tok, layers=2)
    with pytest.raises(ValueError, match="last4 needs 4 layers; the model has 2"):
        embed(tmp_path / "hf2", texts, "last4")

    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "vectors.npy"
    main(
        [
            "embed",
            str(tmp_path / "hf"),
            str(tmp_path / "texts.txt"),
            str(out),
            "--pooling",
            "mean",
            "--jsonl",
            str(tmp_path / "v.jsonl"),
        ]
    )
    np.testing.assert_allclose(np.load(out), embed(tmp_path / "hf", texts, "mean"), atol=1e-6)
    lines = [json.loads(line) for line in (tmp_path / "v.jsonl").read_text().splitlines()]
    assert [line["text"] for line in lines] == texts and len(lines[0]["embedding"]) == 32


def test_embed_refuses_empty_lines_by_number(tmp_path, tok):
    write_hf_folder(tmp_path / "hf", tok)
    (tmp_path / "texts.txt").write_text("the film\n\nbob\n")
    with pytest.raises(DataError, match=r"texts.txt: line 2: empty text"):
        main(
            [
                "embed",
                str(tmp_path / "hf"),
                str(tmp_path / "texts.txt"),
                str(tmp_path / "v.npy"),
                "--debug",
            ]
        )
    assert not (tmp_path / "v.npy").exists()
    write_jsonl(tmp_path / "t.jsonl", [{"text": "a film"}, {"text": " "}])
    with pytest.raises(DataError, match=r"t.jsonl: row 2, column 'text': empty text"):
        read_texts(str(tmp_path / "t.jsonl"))
