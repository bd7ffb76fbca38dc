import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from bert_lightning.data.corpus import BadRecordError, iter_documents
from bert_lightning.data.pipeline import frame_batch
from helpers import SAMPLE, c4_shard, data_module


def test_streamed_shards_split_over_ranks_each_block_once(tmp_path, tiny_tokenizer):
    """The hub code path (`load_dataset(..., streaming=True)`) pointed at local C4-shaped
    shards: with 2 ranks x 2 workers every packed block of the stream is seen exactly once."""
    docs = list(iter_documents([SAMPLE]))
    train = [
        c4_shard(tmp_path / f"c4-train.0000{i}-of-00002.json.gz", docs[i * 40 : i * 40 + 40])
        for i in range(2)
    ]
    val = c4_shard(tmp_path / "c4-validation.00000-of-00001.json.gz", docs[100:110])
    dm = data_module(
        "c4_hub",
        path="json",
        name=None,
        data_files={"train": train, "validation": val},
        val_docs=5,
        max_seq_length=32,
        batch_size=4,
        num_workers=2,
        shuffle_buffer=50,
        given_tokenizer=tiny_tokenizer,
    )
    dm.setup()
    assert len(dm.val_set) > 0 and "labels" in dm.val_set.column_names
    seen = Counter()
    for rank in range(2):
        dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        for batch in dm.train_dataloader():
            assert batch["input_ids"].shape[1] == 32 and "attention_mask" not in batch
            labels = batch["labels"]
            original = torch.where(labels != -100, labels, batch["input_ids"])  # (B, T)
            seen.update(tuple(r) for r in original.tolist())
    expected = Counter()
    for i in range(2):  # one map batch per shard: the blocks of each shard's token stream
        ids = [
            e.ids
            for e in tiny_tokenizer.encode_batch(
                docs[i * 40 : i * 40 + 40], add_special_tokens=False
            )
        ]
        blocks = frame_batch({"input_ids": ids}, 2, 3, 30, "packed")["input_ids"]
        expected.update(tuple(b) for b in blocks)
    assert seen == expected


def test_tokenizer_trains_from_a_sample_of_the_stream(tmp_path):
    docs = list(iter_documents([SAMPLE]))[:60]
    shard = c4_shard(tmp_path / "c4-train.00000-of-00001.json.gz", docs)
    dm = data_module(
        "c4_hub",
        path="json",
        name=None,
        data_files={"train": shard},
        tokenizer={"vocab_size": 400, "max_docs": 30},
        out_dir=str(tmp_path / "out"),
    )
    tok = dm.build_tokenizer()
    assert tok.get_vocab_size() <= 400 and (tmp_path / "out" / "tokenizer.json").is_file()


@pytest.mark.slow
def test_train_py_streams_c4_shaped_shards(tmp_path):
    """`data=c4_hub` through train.py, pointed at local shards: it trains and checkpoints."""
    from bert_lightning.config import compose
    from bert_lightning.training.pretrain import train
    from helpers import tiny_overrides

    docs = list(iter_documents([SAMPLE]))
    train_files = [
        c4_shard(tmp_path / f"c4-train.0000{i}.json.gz", docs[i * 50 : i * 50 + 50])
        for i in range(2)
    ]
    val = c4_shard(tmp_path / "c4-validation.00000.json.gz", docs[200:220])
    overrides = tiny_overrides(
        tmp_path,
        "data=c4_hub",
        "data.train_files=null",  # tiny_overrides' files: a stream refuses them
        "data.cache_dir=null",
        "data.path=json",
        "data.name=null",
        f"+data.data_files.train=[{','.join(train_files)}]",
        f"+data.data_files.validation={val}",
        "data.num_workers=2",
    )
    assert train(compose(overrides=overrides)) > 0
    assert torch.load(tmp_path / "checkpoints/last.ckpt", weights_only=True)["global_step"] == 6


def test_streaming_own_reader_applies_bad_record_rules(tmp_path, tiny_tokenizer):
    """`path=files`: our reader streams the files, so bad records are named or skipped."""
    docs = list(iter_documents([SAMPLE]))
    shard = tmp_path / "c4-train.00000.jsonl"
    shard.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs[:30]) + "{broken\n")
    val = c4_shard(tmp_path / "c4-validation.00000.json.gz", docs[100:110])
    kw = dict(path="files", data_files={"train": str(shard), "validation": val}, val_docs=5)
    kw.update(max_seq_length=32, batch_size=4, num_workers=0, given_tokenizer=tiny_tokenizer)
    dm = data_module("c4_hub", **kw)
    dm.setup()
    with pytest.raises(BadRecordError, match=r"c4-train\.00000\.jsonl:31:\d+: invalid JSON"):
        list(dm.train_dataloader())
    dm = data_module("c4_hub", on_bad_record="skip", **kw)
    dm.setup()
    assert len(list(dm.train_dataloader())) > 10
