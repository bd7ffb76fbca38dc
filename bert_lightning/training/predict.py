"""A catalogue's vectors by Lightning's predict loop: `catalogue.text_vectors` of each batch, so
that `devices` and `strategy` (`ddp`) shard the texts over processes, each text encoded by one
of them (Lightning's predict sampler repeats no row, unlike training's), and rank 0 gathers
them back in the texts' order."""

from __future__ import annotations

import warnings

import lightning as L
import torch
from tokenizers import Tokenizer
from torch.utils.data import DataLoader

from bert_lightning.catalogue import text_vectors
from bert_lightning.choices import SCORE_BATCH
from bert_lightning.model.heads import BertBiEncoder
from bert_lightning.training.trainer import evaluation_trainer

Share = tuple[torch.Tensor, torch.Tensor]  # a rank's rows (n,) and their vectors (n, H)


class TextEncoder(L.LightningModule):
    """`text_vectors` of batches of (rows, texts), each rank's kept; when its share is done,
    rank 0 gathers every rank's and holds all `count` in row order (`vectors`), the other
    ranks None."""

    def __init__(self, model: BertBiEncoder, tok: Tokenizer, count: int):
        super().__init__()
        self.model, self.tok, self.count = model, tok, count
        self.shares: list[Share] = []
        self.vectors: torch.Tensor | None = None

    def predict_step(self, batch: tuple[torch.Tensor, list[str]], batch_idx: int) -> Share:
        rows, texts = batch
        return rows.cpu(), text_vectors(self.model, self.tok, texts, len(texts))  # (B, H)

    def on_predict_batch_end(self, outputs: Share, batch, batch_idx: int, dataloader_idx=0):
        self.shares.append(outputs)

    def on_predict_epoch_end(self) -> None:
        width = self.model.config.hidden_size
        rows = torch.cat([r for r, _ in self.shares]) if self.shares else torch.zeros(0).long()
        vectors = torch.cat([v for _, v in self.shares]) if self.shares else torch.zeros(0, width)
        shares = gathered((rows, vectors), self.trainer)  # (n,) and (n, H) per rank
        self.vectors = None if shares is None else in_row_order(shares, self.count)


def gathered(share: Share, trainer: L.Trainer) -> list[Share] | None:
    """Every rank's share on rank 0, by rank (one collective: the tensors travel pickled, on
    the device NCCL needs); None on the others."""
    if trainer.world_size == 1:
        return [share]
    shares = [None] * trainer.world_size if trainer.is_global_zero else None
    torch.distributed.gather_object(share, shares, dst=0)
    return shares


def in_row_order(shares: list[Share], count: int) -> torch.Tensor:
    """(count, H) the shares' vectors by row; each row of 0..count-1 in exactly one share."""
    rows = torch.cat([r for r, _ in shares])  # (count,)
    vectors = torch.cat([v for _, v in shares])  # (count, H)
    times = torch.bincount(rows, minlength=count)  # (count,) if no row is out of range
    if len(times) != count or not bool((times == 1).all()):
        missing = (times == 0).nonzero().flatten().tolist()
        repeated = (times > 1).nonzero().flatten().tolist()
        raise AssertionError(
            f"the predict loop's ranks encoded {len(rows)} rows for {count} texts: rows "
            f"{missing[:5]} missing, {repeated[:5]} more than once (each must be once)"
        )
    out = torch.empty_like(vectors)
    out[rows] = vectors
    return out


def rows_and_texts(items: list[tuple[int, str]]) -> tuple[torch.Tensor, list[str]]:
    """A batch: its rows (B,) and texts, tokenized by `text_vectors` in the step."""
    return torch.tensor([i for i, _ in items]), [t for _, t in items]


def predicted_vectors(
    model: BertBiEncoder,
    tok: Tokenizer,
    texts: list[str],
    batch_size: int = SCORE_BATCH,
    progress: bool = False,
    **hardware,
) -> torch.Tensor | None:
    """(N, H) what `catalogue.text_vectors` gives (each text alone, pooled, at unit length,
    float32 on the CPU), computed by Lightning's predict loop: with `hardware`'s `devices` > 1
    (`strategy` ddp) each process encodes its share of the texts; rank 0 returns all N in the
    texts' order, every other rank None (Lightning's launcher runs the caller's script again as
    each: what the caller does with the vectors, rank 0 alone does). The texts are batched by
    length as `per_row` batches them: on one device the very batches of `text_vectors`, its
    numbers bit for bit. `devices` beyond the texts' count are not started (each would need a
    row)."""
    if not texts:
        return torch.zeros(0, model.config.hidden_size)
    lengths = [len(e.ids) for e in tok.encode_batch(texts)]
    order = sorted(range(len(texts)), key=lengths.__getitem__)  # as `per_row` orders them
    loader = DataLoader(
        [(i, texts[i]) for i in order], batch_size=batch_size, collate_fn=rows_and_texts
    )
    devices = hardware.get("devices")
    if isinstance(devices, int) and devices > len(texts):  # a process of no rows would fail
        hardware["devices"] = len(texts)
        if len(texts) == 1:
            hardware.pop("strategy", None)
    module = TextEncoder(model, tok, len(texts))
    trainer = evaluation_trainer(progress, **hardware)
    with warnings.catch_warnings():  # the step tokenizes: loader workers would wait on it
        warnings.filterwarnings("ignore", message="The 'predict_dataloader' does not have many")
        trainer.predict(module, loader, return_predictions=False)
    return module.vectors
