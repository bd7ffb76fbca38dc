"""An index's vectors by Lightning's predict loop (training/predict.py, `bert-lightning index
--devices N`): on one process the very vectors of `catalogue.text_vectors`; under DDP on 2 CPU
processes (gloo, as `trainer=ddp_sim`) the same index within 1e-6, each text encoded by one
process, rank 0 holding them all in order and no process left after. 37 texts of 1 to 40
words in batches of 4: the ranks' shares (19 and 18) and their batches are uneven."""

import random
import sys

import numpy as np
import pytest
import torch

from bert_lightning.catalogue import bi_encoder, read_index, text_vectors
from bert_lightning.cli import main
from bert_lightning.inference import load_finetuned
from bert_lightning.training.predict import in_row_order, predicted_vectors
from finetune_fixtures import WORDS, finetuned_ckpt, write_csv, write_tokenizer
from helpers import run_in_session, subprocess_env

TEXTS = [" ".join(random.Random(n).choices(WORDS, k=1 + n * 39 // 36)) for n in range(37)]
BATCH = 4


@pytest.fixture(scope="module")
def bi(tmp_path_factory):
    """(checkpoint path, Finetuned) of a tiny bi-encoder (random weights, 2 layers, width 32,
    texts cut at 32 pieces: the longest ones here are)."""
    folder = tmp_path_factory.mktemp("bi")
    tok = write_tokenizer(folder / "tokenizer.json")
    ckpt = finetuned_ckpt(
        folder / "bi.ckpt", tok, "task=ad_relevance", "task.architecture=bi_encoder"
    )
    return ckpt, load_finetuned(ckpt)


def test_one_process_gives_text_vectors_bit_for_bit(bi, capsys):
    """Batched by length as `per_row` batches: the same batches, the same numbers; unit
    float32 rows on the CPU, the model left in eval mode; rank 0's progress as lines."""
    ckpt, ft = bi
    model, tok = bi_encoder(ft, ckpt), ft.tokenizer()
    assert max(len(e.ids) for e in tok.encode_batch(TEXTS)) == ft.max_seq_length == 32
    got = predicted_vectors(model, tok, TEXTS, BATCH, True, accelerator="cpu")
    assert got.dtype == torch.float32 and got.device.type == "cpu" and got.shape == (37, 32)
    assert torch.equal(got, text_vectors(model, tok, TEXTS, BATCH))
    torch.testing.assert_close(got.norm(dim=1), torch.ones(37), atol=1e-6, rtol=0)
    assert not model.training and not torch.is_inference_mode_enabled()
    assert "batch 10/10" in capsys.readouterr().out


@pytest.mark.slow
def test_index_on_two_processes_writes_what_one_process_writes(bi, tmp_path):
    """`bert-lightning index --devices 2 --accelerator cpu` (DDP on 2 CPU processes, gloo, as
    `trainer=ddp_sim`): the index one process writes, vectors within 1e-6 (other batches) and
    every id once in the catalogue's order (rank 0 refuses a row missing or encoded twice,
    `in_row_order`); rank 0 alone writes and says so; no process is left after
    (`run_in_session`)."""
    ckpt, ft = bi
    ids = [f"sku-{n}" for n in range(len(TEXTS))]
    write_csv(tmp_path / "cat.csv", [{"id": i, "ad": t} for i, t in zip(ids, TEXTS, strict=True)])
    args = ["index", str(ckpt), str(tmp_path / "cat.csv"), "--batch-size", str(BATCH)]
    two = [sys.executable, "-m", "bert_lightning", *args, str(tmp_path / "two")]
    proc = run_in_session([*two, "--devices", "2", "--accelerator", "cpu"], subprocess_env(), 300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("wrote") == 1  # rank 0's line
    assert "batch 5/5 " in proc.stdout  # rank 0's progress over its share: 19 rows, 5 batches
    main([*args, str(tmp_path / "one")])
    one, two = read_index(tmp_path / "one"), read_index(tmp_path / "two")
    assert one.ids == two.ids == ids and one.ads == two.ads == TEXTS
    np.testing.assert_allclose(two.vectors, one.vectors, atol=1e-6, rtol=0)
    model, tok = bi_encoder(ft, ckpt), ft.tokenizer()
    want = text_vectors(model, tok, TEXTS, BATCH).numpy()
    np.testing.assert_allclose(two.vectors, want, atol=1e-6, rtol=0)


def test_no_text_and_fewer_texts_than_devices(bi):
    """No text: (0, H) with no trainer; one text on `devices=2`: one process, in this one,
    which starts no process group."""
    ckpt, ft = bi
    model, tok = bi_encoder(ft, ckpt), ft.tokenizer()
    assert predicted_vectors(model, tok, [], BATCH).shape == (0, 32)
    one = predicted_vectors(
        model, tok, TEXTS[:1], BATCH, accelerator="cpu", devices=2, strategy="ddp"
    )
    assert torch.equal(one, text_vectors(model, tok, TEXTS[:1]))
    assert not torch.distributed.is_initialized()


def test_a_row_missing_or_encoded_twice_is_refused():
    """Rank 0 puts the shares in row order only if each row is in exactly one."""
    v = torch.arange(8.0).reshape(4, 2)  # (4, 2)
    shares = [(torch.tensor([0, 2]), v[:2]), (torch.tensor([1, 3]), v[2:])]
    assert torch.equal(in_row_order(shares, 4), v[[0, 2, 1, 3]])
    twice = [(torch.tensor([0, 2]), v[:2]), (torch.tensor([2, 3]), v[2:])]
    with pytest.raises(AssertionError, match=r"rows \[1\] missing, \[2\] more than once"):
        in_row_order(twice, 4)
    with pytest.raises(AssertionError, match=r"4 rows for 3 texts"):
        in_row_order(shares, 3)
