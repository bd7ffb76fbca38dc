"""The ad relevance baselines (BM25, zero-shot cosine) against hand-computed values."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from tokenizers import Tokenizer

from bert_lightning.checkpoint import read_checkpoint
from bert_lightning.config import compose
from bert_lightning.data.tables import collate
from bert_lightning.data.tokenizer import special_ids
from bert_lightning.inference import zero_shot_cosines
from bert_lightning.tasks.ad_relevance import bm25_scores, score_metrics
from bert_lightning.tasks.base import baselines_table
from bert_lightning.tasks.kinds import make_task
from bert_lightning.weights import ENCODER, load_weights
from finetune_fixtures import write_hf_folder, write_tokenizer

QUERIES = ["red drill", "red drill", "red drill", "oak chair", "oak chair"]
ADS = ["cordless drill red", "oak chair", "red oak chair set", "oak chair", "red drill"]


def test_bm25_by_hand_ranks_the_exact_match_first():
    got = bm25_scores(QUERIES, ADS)
    # Lucene's BM25 over the 4 distinct ads (lengths 3, 2, 4, 2): idf(w) = ln(1 + (N - df + .5) /
    # (df + .5)), times tf / (tf + k1 (1 - b + b dl / avgdl)) (Lucene drops BM25's k1 + 1)
    N, avgdl, k1, b = 4, 11 / 4, 1.5, 0.75
    df = {"red": 3, "drill": 2, "oak": 2, "chair": 2}
    idf = {w: math.log(1 + (N - n + 0.5) / (n + 0.5)) for w, n in df.items()}
    tf = lambda dl: 1 / (1 + k1 * (1 - b + b * dl / avgdl))  # one occurrence, length dl
    want = [
        (idf["red"] + idf["drill"]) * tf(3),
        0.0,  # no word of the query
        idf["red"] * tf(4),
        (idf["oak"] + idf["chair"]) * tf(2),
        0.0,
    ]
    assert got.tolist() == pytest.approx(want, rel=1e-5)
    assert got[0] > got[2] > got[1]  # the exact words first, then one word, then none


def test_score_metrics_of_a_baseline_by_hand():
    cfg = compose("finetune", ["dataset=home_depot", "data_dir=.", "paths.output_dir=."])
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    table = {"target": [1.0, 0.0, 0.5, 1.0, 0.0], "group": ["a", "a", "a", "b", "b"]}
    # a score on any scale: only its order counts (BM25 values of 20 do not saturate AUROC)
    score = torch.tensor([30.0, 10.0, 20.0, 25.0, 5.0])
    got = score_metrics(task, table, score)
    # Spearman: ranks of the targets (ties averaged) 4.5 1.5 3 4.5 1.5, of the scores 5 2 3 4 1
    want = {"test/auroc": 1.0, "test/spearman": 9 / math.sqrt(90), "test/ndcg@10": 1.0}
    assert got == pytest.approx(want)
    flipped = score_metrics(task, table, -score)
    # AUROC: all 6 (relevant, irrelevant) pairs wrong; Spearman of reversed ranks
    assert flipped["test/auroc"] == 0.0 and flipped["test/spearman"] == pytest.approx(
        -9 / math.sqrt(90)
    )
    results = {"rows": {"test": 5}, "test": {"test/loss": 0.1, **got}, "baselines": {"bm25": got}}
    assert baselines_table(results).splitlines()[2].split() == [
        "bm25",
        "1.0000",
        "0.9487",
        "1.0000",
    ]


def test_zero_shot_is_the_cosine_of_mean_pooled_embeddings(tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    queries, ads = ["the good movie", "bob in paris"], ["a nice film", "bob in paris was great"]
    got = zero_shot_cosines(
        str(tmp_path / "hf"), list(zip(queries, ads, strict=True)), max_seq_length=32
    )
    # by hand, with transformers' BertModel: each text alone, mean over its tokens, cosine
    hf = transformers.BertModel.from_pretrained(tmp_path / "hf").eval()
    tok = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))

    def vec(text):
        ids = torch.tensor([tok.encode(text).ids])
        with torch.no_grad():
            return hf(ids).last_hidden_state[0].mean(0)

    want = [
        torch.cosine_similarity(vec(q), vec(a), dim=0) for q, a in zip(queries, ads, strict=True)
    ]
    torch.testing.assert_close(got, torch.stack(want), atol=1e-5, rtol=0)


BI_ENCODER = ["task.architecture=bi_encoder", "task.pooling=mean"]


def test_bi_encoder_starts_from_the_zero_shot_ranking(tmp_path):
    """Before training, a mean-pooled bi-encoder scores 20 cos - 10 with the zero-shot cos."""
    tok = write_tokenizer(tmp_path / "tokenizer.json")
    write_hf_folder(tmp_path / "hf", tok)
    cfg = compose(
        "finetune",
        ["dataset=home_depot", "data_dir=.", "paths.output_dir=.", *BI_ENCODER],
    )
    task = make_task(OmegaConf.to_container(cfg.task, resolve=True))
    pre = read_checkpoint(tmp_path / "hf")
    model = task.build_model(pre.config)
    load_weights(model, pre, ENCODER)
    queries, ads = ["the good movie", "bob", "a"], ["a nice film", "bob in paris was great", "b"]
    table = {"text": queries, "pair": ads, "group": queries, "target": [1.0, 0.5, 0.0]}
    batch = collate(task.encode(table, tok, 32), special_ids(tok)["[PAD]"])
    with torch.no_grad():
        logits = model.eval()(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    want = zero_shot_cosines(
        str(tmp_path / "hf"), list(zip(queries, ads, strict=True)), max_seq_length=32
    )
    torch.testing.assert_close((logits[:, 0] + 10) / 20, want, atol=1e-5, rtol=0)
