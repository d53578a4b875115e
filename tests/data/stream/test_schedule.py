"""The global batch schedule on its own (no media): mixtures by weight, buckets,
and the state that continues it exactly."""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from stoker.data.format.shard_format import AudioInfo, Member, SampleEntry, VideoInfo
from stoker.data.sets.buckets import Bucket, assign_bucket, resolve_buckets, suggest_buckets
from stoker.data.stream.mixture import choose_sources
from stoker.data.stream.order import SampleOrder
from stoker.data.stream.schedule import BatchSchedule, ScheduleState
from stoker.errors import StokerError


def entry(width: int, height: int, seconds: float, *, audio: bool = True) -> SampleEntry:
    video = VideoInfo(
        field="mp4", codec="h264", width=width, height=height, fps=8,
        frames=round(seconds * 8), duration_s=seconds,
    )  # fmt: skip
    sound = AudioInfo(
        field="flac", codec="flac", sample_rate=8000, channels=1,
        frames=round(seconds * 8000), duration_s=seconds,
    )  # fmt: skip
    return SampleEntry(
        key="k", members={"mp4": Member(offset=0, size=1)}, video=video,
        audio=sound if audio else None,
    )  # fmt: skip


def test_random_mixing_follows_the_weights_and_is_the_same_however_drawn() -> None:
    whole = choose_sources("random", [3.0, 1.0], seed=5, slot=0, count=20_000, taken=[0, 0])
    share = np.bincount(whole) / len(whole)
    assert abs(share[0] - 0.75) < 0.02, share
    # Drawn in pieces from any slot (a worker resuming mid-chunk): the same choices.
    pieces = [
        choose_sources("random", [3.0, 1.0], 5, s, 777, [0, 0]) for s in range(0, 20_000, 777)
    ]
    assert np.array_equal(np.concatenate(pieces)[:20_000], whole)
    other_seed = choose_sources("random", [3.0, 1.0], seed=6, slot=0, count=20_000, taken=[0, 0])
    assert not np.array_equal(other_seed, whole)


def test_exact_mixing_holds_every_share_to_one_sample() -> None:
    weights = [0.5, 0.3, 0.2]
    picks = choose_sources("exact", weights, seed=0, slot=0, count=1000, taken=[0, 0, 0])
    counts = np.zeros(3)
    for k, source in enumerate(picks, start=1):
        counts[source] += 1
        assert np.all(np.abs(counts - k * np.asarray(weights)) <= 1.0), (k, counts)
    # Every batch of 10 consecutive slots holds exactly 5, 3 and 2.
    for start in range(0, 1000, 10):
        assert list(np.bincount(picks[start : start + 10], minlength=3)) == [5, 3, 2]


def orders(*sizes: tuple[int, ...]) -> list[SampleOrder]:
    return [
        SampleOrder(shards, seed=1, fingerprint=f"{i + 1:016x}", shuffle_shards=2)
        for i, shards in enumerate(sizes)
    ]


def test_one_data_set_without_buckets_is_the_plain_stream() -> None:
    order = orders((7, 7, 5))[0]
    schedule = BatchSchedule(orders=[order], batch_sizes=[4], seed=1)
    batches = list(itertools.islice(schedule.batches(ScheduleState.start(1, 1)), 10))
    slots = [s for b in batches for s in b.slots]
    assert [s.slot for s in slots] == list(range(40)) == [s.position for s in slots]
    ids = order.sample_ids(0, 40)
    assert [order.locate(int(i)) for i in ids] == [(s.shard, s.local) for s in slots]
    assert batches[-1].after.as_dict() == {
        "batches": 10, "slot": 40, "positions": [40], "waiting": [[]],
    }  # fmt: skip


def test_a_mixture_walks_each_source_in_its_own_order_and_epochs() -> None:
    small, large = orders((3, 2), (10, 10, 10))
    schedule = BatchSchedule(
        orders=[small, large], batch_sizes=[6], seed=1, mixing="exact", weights=[1, 2]
    )
    batches = list(itertools.islice(schedule.batches(ScheduleState.start(2, 1)), 10))
    for batch in batches:
        assert Counter(s.source for s in batch.slots) == {0: 2, 1: 4}
    firsts = [s for b in batches for s in b.slots if s.source == 0]
    assert [s.position for s in firsts] == list(range(20))  # 4 epochs of the 5-sample set
    ids = small.sample_ids(0, 20)
    assert [(s.shard, s.local) for s in firsts] == [small.locate(int(i)) for i in ids]
    for epoch in range(4):  # each epoch of the small set holds each of its samples once
        assert len({(s.shard, s.local) for s in firsts[epoch * 5 : epoch * 5 + 5]}) == 5


BUCKETS = [Bucket((32, 32), 1.0, 4), Bucket((32, 64), 1.0, 2), Bucket((32, 64), 2.0, 2)]


def bucket_of_table(table: dict[tuple[int, int], int]):  # type: ignore[no-untyped-def]
    return lambda shard, local: table[(shard, local)]


def test_buckets_batch_their_own_samples_and_the_state_continues_exactly() -> None:
    order = orders((9, 9, 9, 9))[0]
    rng = np.random.default_rng(0)
    table = {(s, i): int(rng.integers(0, 3)) for s in range(4) for i in range(9)}
    schedule = BatchSchedule(
        orders=[order], batch_sizes=[b.batch_size for b in BUCKETS], seed=1,
        bucket_of=[bucket_of_table(table)],
    )  # fmt: skip
    batches = list(itertools.islice(schedule.batches(ScheduleState.start(1, 3)), 40))
    seen: list[int] = []
    for batch in batches:
        assert len(batch.slots) == BUCKETS[batch.bucket].batch_size
        assert {table[(s.shard, s.local)] for s in batch.slots} == {batch.bucket}
        seen += [s.slot for s in batch.slots]
        assert all(s.slot < batch.after.slot for s in batch.slots)
    assert len(seen) == len(set(seen)), "no slot twice"
    # Every slot up to the last batch's is in a batch or still waiting in its bucket.
    last = batches[-1].after
    waiting = [slot for queue in last.waiting for slot, _, _ in queue]
    assert sorted(seen + waiting) == list(range(last.slot))
    # From any batch's state (as a dict, as a checkpoint holds it): the same continuation.
    for k in (0, 7, 23):
        state = ScheduleState.from_dict(batches[k].after.as_dict())
        again = list(itertools.islice(schedule.batches(state), 40 - k - 1))
        assert [(b.bucket, b.slots) for b in again] == [
            (b.bucket, b.slots) for b in batches[k + 1 :]
        ]


def test_the_bucket_rule() -> None:
    assert assign_bucket(entry(64, 64, 3.0), BUCKETS, video=True) == 0  # square
    assert assign_bucket(entry(128, 64, 3.0), BUCKETS, video=True) == 2  # wide, the longest
    assert assign_bucket(entry(128, 64, 1.5), BUCKETS, video=True) == 1  # 2 s does not fit
    assert assign_bucket(entry(128, 64, 0.5), BUCKETS, video=True) == 1  # none fits: shortest
    assert assign_bucket(entry(50, 40, 3.0), BUCKETS, video=True) == 0  # nearest ratio
    # Audio only: the longest clip that fits.
    assert assign_bucket(entry(64, 64, 3.0), BUCKETS, video=False) == 2
    # The largest frame that does not enlarge the source, else the smallest.
    sizes = [Bucket((16, 16), 1.0, 1), Bucket((64, 64), 1.0, 1), Bucket((32, 32), 1.0, 1)]
    assert assign_bucket(entry(40, 40, 1.0), sizes, video=True) == 2
    assert assign_bucket(entry(8, 8, 1.0), sizes, video=True) == 0


def data_config(**kw: object) -> SimpleNamespace:
    from stoker.config.schema import BucketConfig

    base: dict[str, object] = {
        "modalities": ["video"], "resolution": (64, 64), "fps": 8, "token_patch": (2, 16, 16),
        "audio_tokens_per_s": 50.0, "batch_tokens": None, "batch_multiple": 1,
    }  # fmt: skip
    base.update(kw)
    base["buckets"] = [BucketConfig.model_validate(b) for b in base.get("buckets", [])]  # type: ignore[attr-defined]
    return SimpleNamespace(**base)


def test_batch_sizes_from_a_token_budget() -> None:
    data = data_config(
        buckets=[{"clip_seconds": 1.0}, {"resolution": [32, 64], "clip_seconds": 2.0,
                                         "batch_size": 3}],
        batch_tokens=1000, batch_multiple=2,
    )  # fmt: skip
    first, second = resolve_buckets(data)
    # 64x64 at 8 fps for 1 s, patches 2x16x16: 4 x 4 x 4 = 64 tokens; 1000 // 64 = 15 -> 14.
    assert (first.resolution, first.batch_size, first.name) == ((64, 64), 14, "64x64x1s")
    assert second.batch_size == 3
    tight = data_config(buckets=[{"clip_seconds": 1.0}], batch_tokens=100, batch_multiple=2)
    with pytest.raises(StokerError, match=r"data\.buckets\[0\].*64 tokens.*data\.batch_tokens=100"):
        resolve_buckets(tight)


def test_suggested_buckets_cover_the_common_shapes() -> None:
    entries = [entry(640, 360, 5.0)] * 6 + [entry(360, 640, 3.0)] * 3 + [entry(64, 64, 0.4)]
    rows = suggest_buckets(entries, max_side=256, multiple=16, lengths=2, shapes=2)
    resolutions = {tuple(r["resolution"]) for r in rows}
    assert (144, 256) in resolutions and (256, 144) in resolutions
    assert abs(sum(r["share"] for r in rows) - 1.0) < 1e-6
    # The settings the rows suggest are accepted by the schema.
    data_config(buckets=[{k: v for k, v in r.items() if k != "share"} | {"batch_size": 2}
                         for r in rows])  # fmt: skip
