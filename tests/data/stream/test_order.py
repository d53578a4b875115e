"""The global sample order: a pure function of (seed, epoch, manifest), one
permutation per epoch, and nothing else."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stoker.data.stream.order import SampleOrder

SIZES = (5, 9, 1, 7, 12, 3, 8)  # uneven shards on purpose
N = sum(SIZES)


def order(**kw: object) -> SampleOrder:
    args: dict[str, object] = {"shard_sizes": SIZES, "seed": 3, "fingerprint": "00ff00ff00ff00ff"}
    args.update(kw)
    return SampleOrder(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("shuffle", [True, False])
def test_every_epoch_is_one_permutation(shuffle: bool) -> None:
    o = order(shuffle=shuffle, shuffle_shards=2)
    epochs = [o.sample_ids(e * N, (e + 1) * N) for e in range(3)]
    for ids in epochs:
        assert sorted(ids.tolist()) == list(range(N))
    if shuffle:
        assert epochs[0].tolist() != epochs[1].tolist() != epochs[2].tolist()
        assert epochs[0].tolist() != list(range(N))
    else:
        assert all(ids.tolist() == list(range(N)) for ids in epochs)


def test_order_depends_on_seed_and_manifest_only() -> None:
    a = order().sample_ids(0, 2 * N).tolist()
    assert order().sample_ids(0, 2 * N).tolist() == a  # a fresh object, same answer
    assert order(seed=4).sample_ids(0, 2 * N).tolist() != a
    assert order(fingerprint="00ff00ff00ff00fe").sample_ids(0, 2 * N).tolist() != a


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=4 * N), min_size=1, max_size=8))
def test_any_split_of_a_range_reads_the_same_ids(cuts: list[int]) -> None:
    """Workers and ranks read the stream in pieces; the pieces must agree with the whole."""
    o = order()
    whole = o.sample_ids(0, 4 * N).tolist()
    bounds = sorted({0, 4 * N, *cuts})
    pieces = [o.sample_ids(a, b).tolist() for a, b in itertools.pairwise(bounds)]
    assert [i for piece in pieces for i in piece] == whole


def test_samples_stay_within_their_shuffle_block() -> None:
    """Two-level shuffle: a run of `shuffle_shards` shards' worth of positions draws from
    those shards only, so a worker needs a few shard indexes at a time."""
    o = order(shuffle_shards=2)
    shards = [o.locate(int(i))[0] for i in o.sample_ids(0, N)]
    runs = []
    for s in shards:
        if s not in (runs[-1] if runs else set()):
            if runs and len(runs[-1]) < 2:
                runs[-1].add(s)
            else:
                runs.append({s})
    assert len(runs) == (len(SIZES) + 1) // 2


def test_locate_maps_ids_back_to_shard_and_offset() -> None:
    o = order()
    starts = np.concatenate([[0], np.cumsum(SIZES)])
    for shard, size in enumerate(SIZES):
        for local in range(size):
            assert o.locate(int(starts[shard]) + local) == (shard, local)


def test_empty_data_set_is_refused() -> None:
    with pytest.raises(ValueError, match="no samples"):
        order(shard_sizes=(0, 0))
