"""`streaming=true`: documents streamed through `datasets` and tokenized on the fly, for corpora
too big for the disk, or read straight from the hub (`allenai/c4`, config `en`).

Nothing is cached: each rank reads its own shards (`split_dataset_by_node`), the data loader
spreads them over its workers, and blocks are packed and shuffled in a buffer as they stream.
The tokenizer is trained on the first `tokenizer.max_docs` documents of the stream, and the
validation set is the first `val_docs` documents of the validation split, masked once.
"""

from __future__ import annotations

from itertools import islice

import datasets
from datasets.distributed import split_dataset_by_node
from tokenizers import Tokenizer

from bert_lightning.data.corpus import READ, resolve_files
from bert_lightning.data.pipeline import (
    encode,
    frame_batch,
    framing,
    mask_once,
    mlm_examples,
    text_rows,
)
from bert_lightning.data.pretraining import BertDataModule, world_and_rank
from bert_lightning.errors import UserError
from bert_lightning.fingerprints import file_stamps


def stream_documents(
    path: str, name: str | None, data_files: dict, split: str, read: dict
) -> datasets.IterableDataset:
    """The `text` of a split, streamed; the hub is only reached here. `path=files`: our reader
    over `data_files[split]` (sharded over ranks and workers), with the `read` options."""
    if path == "files":
        if split not in data_files:
            raise UserError(f"data.data_files has no {split!r} files")
        return datasets.IterableDataset.from_generator(
            text_rows, gen_kwargs={"files": resolve_files(data_files[split]), **read}
        ).select_columns(["text"])
    ds = datasets.load_dataset(
        path, name, split=split, data_files=data_files or None, streaming=True
    )
    return ds.select_columns(["text"]).filter(lambda row: bool(row["text"].strip()))


def stream_examples(
    docs: datasets.IterableDataset, tokenizer: Tokenizer, packing: str, max_seq_length: int
) -> datasets.IterableDataset:
    """Streamed documents -> examples, tokenized and framed as they stream (as `mlm_examples`)."""
    return docs.map(
        encode, batched=True, fn_kwargs={"tokenizer": tokenizer}, remove_columns="text"
    ).map(
        frame_batch,
        batched=True,
        batch_size=1000,
        fn_kwargs=framing(tokenizer, packing, max_seq_length),
    )


class StreamingDataModule(BertDataModule):
    """`path`, `name`, `data_files`: the arguments of `datasets.load_dataset` (`json` and
    `data_files` for local shards). `path=files` reads `data_files` (files, folders, globs per
    split) with our own reader instead: `.txt` sources and `on_bad_record`/`max_doc_chars`
    apply, and a bad record is named by file and line. `shuffle_buffer`: blocks held for
    shuffling."""

    def __init__(
        self,
        *,
        path: str,
        name: str | None,
        data_files: dict | None,
        train_split: str,
        val_split: str,
        shuffle_buffer: int,
        **kwargs,
    ):
        for key in ("train_files", "val_files", "cache_format", "cache_dir"):
            value = kwargs.pop(key)  # the files config's keys, null in a stream's
            if value is not None:
                raise UserError(
                    f"data.{key}={value!r}: a stream caches nothing and reads "
                    "data.path (data.path=files: the files of data.data_files.<split>); "
                    f"leave data.{key} null"
                )
        super().__init__(cache_dir=None, **kwargs)
        if path != "files":  # `datasets` reads the hub's records, not our reader
            for key, value in self.read_settings().items():
                if value != READ[key]:
                    raise UserError(
                        f"data.{key}={value!r} applies to files our reader reads "
                        f"(data.path=files), not to data.path={path}"
                    )
        self.path, self.name = path, name
        # plain dict/list/str (Hydra passes its own containers, which `datasets` cannot read)
        self.data_files = {
            split: files if isinstance(files, str) else list(files)
            for split, files in (data_files or {}).items()
        }
        self.train_split, self.val_split = train_split, val_split
        self.shuffle_buffer = shuffle_buffer

    def source(self):
        return f"{self.path} split {self.train_split!r}"

    def source_record(self) -> dict:
        files = {
            split: [list(s) for s in file_stamps(resolve_files(spec))]
            for split, spec in self.data_files.items()
            if self.path == "files"
        }
        return {
            "data.path": self.path,
            "data.name": self.name,
            "data.data_files": files or self.data_files,
            "data.train_split": self.train_split,
            "data.val_split": self.val_split,
            "data.val_docs": self.val_docs,
            "data.shuffle_buffer": self.shuffle_buffer,
        }

    def stream(self, split: str) -> datasets.IterableDataset:
        return stream_documents(self.path, self.name, self.data_files, split, self.read_options())

    def _texts(self, split: str, n: int | None):
        return (row["text"] for row in islice(self.stream(split), n))

    def tokenizer_documents(self):
        return self._texts(self.train_split, self.tokenizer_cfg.max_docs)

    def build(self) -> tuple[None, datasets.Dataset]:
        """The validation set only: the training stream is opened by each data loader."""
        docs = [{"text": t} for t in self._texts(self.val_split, self.val_docs)]
        if not docs:
            raise UserError(f"{self.path}: split {self.val_split!r} has no documents")
        examples = mlm_examples(
            datasets.Dataset.from_list(docs),
            self.tokenizer,
            self.packing,
            self.max_seq_length,
            self.num_proc,
        )
        return None, mask_once(self.bounded(examples), self.collator(), self.seed)

    def train_dataloader(self):
        world, rank = world_and_rank(self.trainer)
        docs = split_dataset_by_node(self.stream(self.train_split), rank=rank, world_size=world)
        ds = stream_examples(docs, self.tokenizer, self.packing, self.max_seq_length)
        return self._loader(ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer))
