import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from bert_lightning.data.sampling import EpochSampler, SeededExamples


def indices_seen(n, world, workers, epoch, seed=7, batch_size=4, chunk=1 << 20):
    """Every rank's loader, as DDP builds them: the example indices each rank gets."""
    examples = [{"i": i} for i in range(n)]
    seen = []
    for rank in range(world):
        sampler = EpochSampler(examples, num_replicas=world, rank=rank, seed=seed, chunk=chunk)
        sampler.set_epoch(epoch)
        loader = StatefulDataLoader(
            SeededExamples(examples, seed),
            batch_size=batch_size,
            sampler=sampler,
            num_workers=workers,
            collate_fn=lambda rows: [(r["i"], r["mask_seed"]) for r in rows],
        )
        seen.append([x for batch in loader for x in batch])
    return seen


@pytest.mark.parametrize(
    ("n", "world", "workers", "chunk"),
    [(101, 2, 2, 1 << 20), (64, 2, 0, 1 << 20), (50, 3, 2, 1 << 20), (101, 3, 2, 8), (97, 4, 0, 1)],
)
def test_each_example_once_per_epoch_across_ranks_and_workers(n, world, workers, chunk):
    """`chunk` < n: the two-level permutation (runs of `chunk` indices) keeps the rule."""
    seen = indices_seen(n, world, workers, epoch=0, chunk=chunk)
    flat = [i for rank in seen for i, _ in rank]
    assert len(flat) == len(set(flat)) == n - n % world  # no duplicates; the tail rule
    assert {len(rank) for rank in seen} == {n // world}  # equal shares: ranks never wait
    seeds = [s for rank in seen for _, s in rank]
    assert len(set(seeds)) == len(seeds)  # a distinct mask seed per example


def test_shuffle_is_reproducible_and_differs_per_epoch():
    first = indices_seen(101, 2, 0, epoch=0)
    assert indices_seen(101, 2, 2, epoch=0) == first  # the same with workers
    second = indices_seen(101, 2, 0, epoch=1)
    assert second != first
    # the examples left out (n % N) differ between epochs, so none is lost for good
    assert set(range(101)) == {i for r in first + second for i, _ in r}
    order = [i for i, _ in first[0]]
    assert order != sorted(order)
    # mask seeds depend on the epoch: an example gets a fresh mask each epoch
    s0 = dict(x for r in first for x in r)
    s1 = dict(x for r in second for x in r)
    assert all(s0[i] != s1[i] for i in s0.keys() & s1.keys())


def test_two_level_shuffle_mixes_runs():
    order = [i for i, _ in indices_seen(1000, 1, 0, epoch=0, chunk=100)[0]]
    assert sorted(order) == list(range(1000)) and order != sorted(order)
    # the first run served draws from the whole corpus, not from 100 neighbouring examples: a
    # corpus stored source by source is mixed from the first step
    tenths = [sum(1 for i in order[:100] if i // 100 == t) for t in range(10)]
    assert min(tenths) >= 3 and max(tenths) <= 20, tenths


def epoch_loader(examples, seed=7, workers=0):
    return StatefulDataLoader(
        SeededExamples(examples, seed),
        batch_size=4,
        sampler=EpochSampler(examples, seed=seed),
        num_workers=workers,
        collate_fn=lambda rows: [(r["i"], r["mask_seed"]) for r in rows],
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_loader_resumed_in_a_later_epoch_continues_its_order_and_masks(workers):
    """A resumed run loads the loader's state and fetches a batch before Lightning sets the
    sampler's epoch: the state carries the epoch, so the rest of epoch 2 is epoch 2's order
    and mask seeds, not epoch 0's."""
    examples = [{"i": i} for i in range(37)]
    whole = epoch_loader(examples, workers=workers)
    whole.sampler.set_epoch(2)
    it = iter(whole)
    seen = [next(it) for _ in range(3)]
    state = whole.state_dict()
    rest = list(it)
    resumed = epoch_loader(examples, workers=workers)  # its sampler's epoch still 0
    resumed.load_state_dict(state)
    assert list(resumed) == rest and len(seen + rest) == 10
