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

from bert_lightning.data.corpus import iter_documents, resolve_files
from bert_lightning.data.mlm import PretrainDataModule, _frame, _tokenize
from bert_lightning.errors import UserError


def _stream_documents(files: list[str], **read):
    for text in iter_documents(files, **read):
        yield {"text": text}


class StreamingDataModule(PretrainDataModule):
    """`path`, `name`, `data_files`: the arguments of `datasets.load_dataset` (`json` and
    `data_files` for local shards). `path=files` reads `data_files` (files, folders, globs per
    split) with our own reader instead: `.txt` sources and `on_bad_record`/`max_doc_chars`
    apply, and a bad record is named by file and line. `shuffle_buffer`: blocks held for
    shuffling."""

    def __init__(
        self,
        path: str = "allenai/c4",
        name: str | None = "en",
        data_files: dict | None = None,
        train_split: str = "train",
        val_split: str = "validation",
        shuffle_buffer: int = 10_000,
        **kwargs,
    ):
        kwargs["train_files"] = None
        super().__init__(**kwargs)
        self.path, self.name = path, name
        # plain dict/list/str (Hydra passes its own containers, which `datasets` cannot read)
        self.data_files = {
            split: files if isinstance(files, str) else list(files)
            for split, files in (data_files or {}).items()
        }
        self.train_split, self.val_split = train_split, val_split
        self.shuffle_buffer = shuffle_buffer

    def stream(self, split: str) -> datasets.IterableDataset:
        """The `text` of a split, streamed; the hub is only reached here."""
        if self.path == "files":  # the file list is sharded over ranks and workers
            if split not in self.data_files:
                raise UserError(f"data.data_files has no {split!r} files")
            return datasets.IterableDataset.from_generator(
                _stream_documents,
                gen_kwargs={"files": resolve_files(self.data_files[split]), **self.read_options()},
            )
        ds = datasets.load_dataset(
            self.path,
            self.name,
            split=split,
            data_files=self.data_files or None,
            streaming=True,
        )
        return ds.select_columns(["text"]).filter(lambda row: bool(row["text"].strip()))

    def _texts(self, split: str, n: int | None):
        return (row["text"] for row in islice(self.stream(split), n))

    def tokenizer_documents(self):
        return self._texts(self.train_split, self.tokenizer_cfg.max_docs)

    def prepare_data(self):
        pass  # nothing to cache

    def setup(self, stage: str | None = None):
        if self.tokenizer is None:
            raise RuntimeError("call build_tokenizer(out_dir) before preparing the data")
        if self.val_set is None:
            docs = [{"text": t} for t in self._texts(self.val_split, self.val_docs)]
            if not docs:
                raise UserError(f"{self.path}: split {self.val_split!r} has no documents")
            self.val_set = self._validation(datasets.Dataset.from_list(docs))

    def train_dataloader(self):
        world, rank = (
            (self.trainer.world_size, self.trainer.global_rank) if self.trainer else (1, 0)
        )
        ds = split_dataset_by_node(self.stream(self.train_split), rank=rank, world_size=world)
        ds = ds.map(
            _tokenize, batched=True, fn_kwargs={"tokenizer": self.tokenizer}, remove_columns="text"
        ).map(
            _frame,
            batched=True,
            batch_size=1000,
            fn_kwargs=self._frame_kwargs(),
        )
        return self._loader(ds.shuffle(seed=self.seed, buffer_size=self.shuffle_buffer))
