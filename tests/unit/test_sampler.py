"""ShardedSampler: determinism, disjoint covering shards, per-epoch reshuffle, resume."""

from __future__ import annotations

import itertools

import pytest

from zbrl.data import ShardedSampler
from zbrl.data.sampler import permutation


def shards(num_items, num_shards, **kwargs):
    return [
        ShardedSampler(num_items, num_shards=num_shards, shard_index=k, **kwargs)
        for k in range(num_shards)
    ]


def test_permutation_is_a_permutation_and_deterministic():
    order = permutation(1000, seed=7, epoch=3)
    assert sorted(order) == list(range(1000))
    assert order == permutation(1000, seed=7, epoch=3)
    assert order != list(range(1000))
    assert order != permutation(1000, seed=8, epoch=3)
    assert permutation(1000, seed=0, epoch=1) != permutation(1000, seed=1, epoch=0)


def test_deterministic_across_instances():
    a = ShardedSampler(50, num_shards=3, shard_index=1, seed=11)
    b = ShardedSampler(50, num_shards=3, shard_index=1, seed=11)
    assert list(a.iter_epochs(3)) == list(b.iter_epochs(3))


def test_different_seed_gives_different_order():
    a = ShardedSampler(50, num_shards=1, shard_index=0, seed=1)
    b = ShardedSampler(50, num_shards=1, shard_index=0, seed=2)
    assert a.epoch_indices(0) != b.epoch_indices(0)


@pytest.mark.parametrize(("num_items", "num_shards"), [(10, 1), (10, 3), (12, 4), (7, 7), (3, 5)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shards_are_disjoint_and_cover_the_epoch(num_items, num_shards, shuffle):
    samplers = shards(num_items, num_shards, seed=5, shuffle=shuffle)
    for epoch in range(3):
        parts = [s.epoch_indices(epoch) for s in samplers]
        flat = list(itertools.chain.from_iterable(parts))
        assert len(flat) == len(set(flat)) == num_items
        assert sorted(flat) == list(range(num_items))
        lengths = [len(p) for p in parts]
        assert max(lengths) - min(lengths) <= 1
        assert lengths == [len(s) for s in samplers]


def test_drop_last_gives_equal_disjoint_shards():
    samplers = shards(10, 3, seed=5, drop_last=True)
    assert [len(s) for s in samplers] == [3, 3, 3]
    for epoch in range(3):
        parts = [s.epoch_indices(epoch) for s in samplers]
        flat = list(itertools.chain.from_iterable(parts))
        assert len(flat) == len(set(flat)) == 9
        assert all(len(p) == 3 for p in parts)


def test_no_shuffle_is_in_order():
    sampler = ShardedSampler(7, num_shards=2, shard_index=1, seed=0, shuffle=False)
    assert sampler.epoch_indices(0) == [1, 3, 5]
    assert sampler.epoch_indices(4) == [1, 3, 5]


def test_each_epoch_gets_a_different_permutation():
    sampler = ShardedSampler(100, num_shards=2, shard_index=0, seed=3)
    epochs = [tuple(sampler.epoch_indices(e)) for e in range(5)]
    assert len(set(epochs)) == 5
    # shards are re-dealt every epoch, so a shard does not keep the same items
    assert len({frozenset(e) for e in epochs}) == 5


def test_iter_epochs_yields_epoch_tagged_indices():
    sampler = ShardedSampler(5, num_shards=2, shard_index=0, seed=1)
    got = list(sampler.iter_epochs(2))
    assert got == [(0, i) for i in sampler.epoch_indices(0)] + [
        (1, i) for i in sampler.epoch_indices(1)
    ]
    assert sampler.state() == {"epoch": 2, "position": 0}
    assert list(sampler.iter_epochs(2)) == []


def test_iter_epochs_forever():
    sampler = ShardedSampler(3, num_shards=1, shard_index=0, seed=1)
    got = list(itertools.islice(sampler.iter_epochs(None), 10))
    assert [e for e, _ in got] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]


@pytest.mark.parametrize("stop_after", [0, 1, 3, 4, 7, 12])
def test_state_resume_continues_exactly(stop_after):
    kwargs = {"num_shards": 3, "shard_index": 2, "seed": 9}
    reference = list(ShardedSampler(13, **kwargs).iter_epochs(3))
    first = ShardedSampler(13, **kwargs)
    head = list(itertools.islice(first.iter_epochs(3), stop_after))
    state = first.state()
    resumed = ShardedSampler(13, **kwargs)
    resumed.load_state(dict(state))
    tail = list(resumed.iter_epochs(3))
    assert head + tail == reference


def test_state_after_last_index_of_an_epoch_points_at_next_epoch():
    sampler = ShardedSampler(4, num_shards=2, shard_index=0, seed=0)
    it = sampler.iter_epochs(3)
    next(it)
    assert sampler.state() == {"epoch": 0, "position": 1}
    next(it)
    assert sampler.state() == {"epoch": 1, "position": 0}


def test_load_state_normalises_end_of_epoch_and_validates():
    sampler = ShardedSampler(4, num_shards=2, shard_index=0, seed=0)
    sampler.load_state({"epoch": 1, "position": 2})
    assert sampler.state() == {"epoch": 2, "position": 0}
    with pytest.raises(ValueError, match="position must be an int in"):
        sampler.load_state({"epoch": 0, "position": 3})
    with pytest.raises(ValueError, match="missing position"):
        sampler.load_state({"epoch": 0})
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        sampler.load_state({"epoch": -1, "position": 0})


def test_empty_shard_yields_nothing():
    samplers = shards(2, 3, seed=0)
    assert [len(s) for s in samplers] == [1, 1, 0]
    assert list(samplers[2].iter_epochs(2)) == []


@pytest.mark.parametrize(
    ("num_items", "kwargs", "match"),
    [
        (10, {"num_shards": 0, "shard_index": 0}, "num_shards must be >= 1"),
        (10, {"num_shards": 2, "shard_index": 2}, r"shard_index must be in \[0, 1\]"),
        (10, {"num_shards": 2, "shard_index": -1}, "shard_index must be in"),
        (3, {"num_shards": 4, "shard_index": 0, "drop_last": True}, "num_items=3 < num_shards=4"),
        (0, {"num_shards": 1, "shard_index": 0}, "num_items must be >= 1"),
    ],
)
def test_invalid_arguments(num_items, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ShardedSampler(num_items, seed=0, **kwargs)


def test_state_is_plain_and_a_used_sampler_can_be_rewound():
    """The state pickles as a plain dict; loading it into a sampler that already handed out
    indices and restarting ``iter_epochs`` (what a resumed Producer does) continues from it."""
    import pickle

    kwargs = {"num_shards": 2, "shard_index": 1, "seed": 4}
    reference = list(ShardedSampler(9, **kwargs).iter_epochs(2))
    first = ShardedSampler(9, **kwargs)
    stream = first.iter_epochs(2)
    head = list(itertools.islice(stream, 3))
    state = pickle.loads(pickle.dumps(first.state()))
    assert state == {"epoch": 0, "position": 3}
    list(itertools.islice(stream, 4))  # the same sampler runs on into the next epoch
    first.load_state(state)
    assert head + list(first.iter_epochs(2)) == reference
