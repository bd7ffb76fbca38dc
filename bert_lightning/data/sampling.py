"""Which examples a rank sees in an epoch, in which order, and with which mask.

The rule, for N ranks x W workers: each epoch draws a permutation of the n examples from
`seed + epoch`; its first `N * (n // N)` entries are dealt round-robin to the ranks (rank r takes
positions r, r + N, ...), and the last `n % N` are left out of that epoch (a different few each
epoch, so none is lost for good; every rank gets the same count, so DDP ranks never wait on one
another). Within a rank the data loader hands whole batches to its W workers, so each example is
loaded by exactly one worker. The last batch of a rank may be short (every rank's alike).

Masks are drawn from a seed carried by each example (run seed, epoch, index), not from a
process's global random state: a batch gets the same mask whichever worker builds it and after
a resume, where worker random states start afresh.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import torch
from torch.utils.data import Dataset, DistributedSampler


class EpochSampler(DistributedSampler):
    """`DistributedSampler` semantics (shuffled per epoch from `seed + epoch`, tail dropped)
    yielding `(index, epoch)`, so that examples know the epoch their mask belongs to. Lightning
    calls `set_epoch` each epoch (also when resuming) and keeps this sampler under DDP.

    The permutation is two-level, so that memory does not grow with the corpus (a full
    `randperm` of C4's 1.2 billion 128-token blocks would hold 10 GB per rank): the order of
    `chunk`-sized runs of positions is shuffled, then the positions within each run, and a
    position p is example `(a * p + b) mod n` (a bijection, `a` coprime to n, both drawn from
    the seed). Consecutive positions land `a` apart, so each run draws from the whole corpus:
    read as runs of neighbouring examples, a corpus stored source by source (Wikipedia shards,
    then books) would be trained one source at a time for the first million examples. One run
    (n <= chunk) is a whole permutation already and is served as it is."""

    def __init__(self, dataset, num_replicas=1, rank=0, seed: int = 0, chunk: int = 1 << 20):
        super().__init__(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.chunk = chunk

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return _EpochPosition(self)

    @staticmethod
    def item(index: int, epoch: int) -> tuple[int, int]:
        return index, epoch

    def indices(self, epoch: int) -> Iterator[int]:
        """This rank's examples of `epoch`, in order."""
        n, N, chunk = len(self.dataset), self.num_replicas, self.chunk
        g = torch.Generator().manual_seed(self.seed + epoch)
        a, b = spread(n, g) if n > chunk else (1, 0)
        pos = 0  # position in the epoch's global order
        for c in torch.randperm(-(-n // chunk), generator=g).tolist():
            lo = c * chunk
            run = (torch.randperm(min(chunk, n - lo), generator=g) + lo) * a % n
            run = (run + b) % n
            first = (self.rank - pos) % N  # this rank's positions: rank, rank + N, ...
            mine = run[first::N][: max(0, -(-(self.total_size - pos - first) // N))]
            pos += len(run)
            yield from mine.tolist()


def spread(n: int, g: torch.Generator) -> tuple[int, int]:
    """(a, b) of the bijection p -> (a * p + b) mod n: `a` coprime to n, drawn from the upper
    half of [1, n) (a small `a` would keep neighbours near one another)."""
    while True:
        a = int(torch.randint(n // 2, n, (), generator=g))
        if math.gcd(a, n) == 1:
            return a, int(torch.randint(0, n, (), generator=g))


class SeededExamples(Dataset):
    """A map-style view of `examples` indexed by `(index, epoch)`; each row gains `mask_seed`."""

    def __init__(self, examples, seed: int):
        self.examples, self.seed = examples, seed

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, key: tuple[int, int]) -> dict:
        index, epoch = key
        row = dict(self.examples[index])
        row["mask_seed"] = hash_seed(self.seed, epoch, index)
        return row


def hash_seed(*parts: int) -> int:
    """Distinct small ints -> a well-spread 63-bit seed (splitmix64 steps)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 31)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
    return x >> 1


class ResumableShuffle(EpochSampler):
    """`EpochSampler`'s order as plain indices (fine-tuning's rows, which carry no mask)."""

    @staticmethod
    def item(index: int, epoch: int) -> int:
        return index


class _EpochPosition:
    """One epoch of an EpochSampler, resumable mid-epoch whenever the loader is built: its
    state (the epoch, the indices handed out) travels in `StatefulDataLoader`'s, so a resumed
    run continues that epoch's permutation where it stopped. The epoch must be in that state:
    a resumed loader fetches its first batch before Lightning sets the sampler's epoch (and a
    run bound by epochs builds its loader before). The epoch is read at the first index
    (Lightning calls `set_epoch` after asking for the iterator), unless a state gave it."""

    def __init__(self, sampler: ResumableShuffle):
        self.sampler, self.epoch, self.yielded, self.left = sampler, None, 0, None

    def __iter__(self):
        return self

    def __next__(self) -> int:
        if self.left is None:
            if self.epoch is None:
                self.epoch = self.sampler.epoch
            self.left = itertools.islice(self.sampler.indices(self.epoch), self.yielded, None)
        index = next(self.left)
        self.yielded += 1
        return self.sampler.item(index, self.epoch)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "yielded": self.yielded}

    def load_state_dict(self, state: dict) -> None:
        """A state saved once its epoch was handed out (a checkpoint at an epoch's end) goes
        on with the next: Lightning takes it for the next epoch's iterator when resuming."""
        self.epoch, self.yielded, self.left = state["epoch"], state["yielded"], None
        if self.epoch is not None and self.yielded >= self.sampler.num_samples:
            self.epoch, self.yielded = self.epoch + 1, 0


class KeepsTrainLoaderPosition:
    """A LightningDataModule's train loader position, kept in the data module's own state as
    well as in Lightning's loop state: a run bound by epochs builds its loader before the
    checkpoint's loops are restored (its schedule counts the steps, `estimated_stepping_
    batches`), and Lightning then never applies their copy (the resumed run began its epoch
    again); the data module's is restored first, and `resumed(loader)` applies it."""

    train_loader_state: dict | None = None  # a resumed run's, until its loader is built

    def resumed(self, loader):
        if self.train_loader_state is not None:
            loader.load_state_dict(self.train_loader_state)
            self.train_loader_state = None
        return loader

    def state_dict(self) -> dict:
        loader = self.trainer.train_dataloader if self.trainer else None
        return {"train_loader": loader.state_dict()} if loader is not None else {}

    def load_state_dict(self, state: dict) -> None:
        self.train_loader_state = state.get("train_loader")
