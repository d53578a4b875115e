"""The global batch schedule: which samples make up global batch n, for every n.

Slots k = 0, 1, 2, ... of the merged stream each take the next sample of one source
(stoker/data/stream/mixture.py); each source walks its own order (stoker/data/stream/order.py) with
its own epochs. Without buckets, global batch n is the next `batch_size` slots. With
buckets, slots fall into their sample's bucket (stoker/data/sets/buckets.py) and a bucket
that holds its batch size of samples becomes the next global batch: every rank and
worker computes the same sequence, so all ranks get the same bucket at the same step.

Everything that decides the sequence (seed, sources and their orders, weights,
buckets) is fixed for a run, so the sequence is a pure function of them, and the
schedule's state after a batch (`ScheduleState`: the next slot, each source's position
and the samples waiting in each bucket) continues it exactly, on any number of ranks
and workers. A sample's slot number is its `position` in the batch: unique over the
run, it seeds the sample's clip start and noise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.data.stream.mixture import choose_sources
from stoker.data.stream.order import SampleOrder
from stoker.modes import Mixing

BucketOf = Callable[[int, int], int]
"""(shard, sample in shard) -> bucket number, for one source."""

# Slots drawn at once while filling buckets.
_CHUNK = 256


@dataclass(frozen=True)
class Slot:
    """One sample of a global batch."""

    slot: int
    """Its place in the merged stream (the batch's `position`)."""
    source: int
    position: int
    """Its place in its source's own stream (epochs of that source included)."""
    shard: int
    local: int
    """Sample number within the shard."""


@dataclass
class ScheduleState:
    """Where the schedule stands after a batch: what continues it exactly."""

    batches: int = 0
    """Global batches taken."""
    slot: int = 0
    """The next slot of the merged stream."""
    positions: list[int] = field(default_factory=list)
    """Each source's next position."""
    waiting: list[list[tuple[int, int, int]]] = field(default_factory=list)
    """Per bucket: (slot, source, position) of the samples waiting for a full batch."""

    @classmethod
    def start(cls, sources: int, buckets: int) -> ScheduleState:
        return cls(0, 0, [0] * sources, [[] for _ in range(buckets)])

    def as_dict(self) -> dict[str, Any]:
        return {
            "batches": self.batches,
            "slot": self.slot,
            "positions": list(self.positions),
            "waiting": [[list(item) for item in queue] for queue in self.waiting],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScheduleState:
        return cls(
            batches=int(data["batches"]),
            slot=int(data["slot"]),
            positions=[int(p) for p in data["positions"]],
            waiting=[[(int(a), int(b), int(c)) for a, b, c in q] for q in data["waiting"]],
        )

    def copy(self) -> ScheduleState:
        return ScheduleState(
            self.batches, self.slot, list(self.positions), [list(q) for q in self.waiting]
        )


@dataclass(frozen=True)
class GlobalBatch:
    bucket: int
    slots: tuple[Slot, ...]
    after: ScheduleState
    """The state once this batch is taken."""


@dataclass
class BatchSchedule:
    orders: Sequence[SampleOrder]
    """Each source's sample order."""
    batch_sizes: Sequence[int]
    """Global batch size per bucket; one entry without buckets."""
    seed: int
    mixing: Mixing = "random"
    weights: Sequence[float] = (1.0,)
    bucket_of: Sequence[BucketOf] | None = None
    """Per source; None without buckets."""

    def batches(self, state: ScheduleState) -> Iterator[GlobalBatch]:
        """The global batches after `state`, endlessly."""
        state = state.copy()
        if self.bucket_of is None:
            while True:
                slots = self._draw(state, self.batch_sizes[0])
                state.batches += 1
                yield GlobalBatch(0, slots, state.copy())
        while True:
            for item in self._draw(state, _CHUNK):
                bucket = self.bucket_of[item.source](item.shard, item.local)
                queue = state.waiting[bucket]
                queue.append((item.slot, item.source, item.position))
                state.slot = item.slot + 1
                state.positions[item.source] = item.position + 1
                if len(queue) >= self.batch_sizes[bucket]:
                    taken = [self._slot(*entry) for entry in queue]
                    state.waiting[bucket] = []
                    state.batches += 1
                    yield GlobalBatch(bucket, tuple(taken), state.copy())

    def _draw(self, state: ScheduleState, count: int) -> tuple[Slot, ...]:
        """The next `count` slots after `state` (state.slot and positions advance)."""
        sources = choose_sources(
            self.mixing, self.weights, self.seed, state.slot, count, state.positions
        )
        positions = np.empty(count, dtype=np.int64)
        shards = np.empty(count, dtype=np.int64)
        locals_ = np.empty(count, dtype=np.int64)
        # Whole arrays at a time: every worker walks every batch of the schedule (a
        # slot at a time, this was 8% of a latent loader's worker).
        for source in np.unique(sources):
            picked = np.flatnonzero(sources == source)
            first = state.positions[source]
            positions[picked] = np.arange(first, first + len(picked))
            order = self.orders[source]
            shards[picked], locals_[picked] = order.locate_all(
                order.sample_ids(first, first + len(picked))
            )
        out = [
            Slot(state.slot + j, source, position, shard, local)
            for j, (source, position, shard, local) in enumerate(
                zip(
                    sources.tolist(),
                    positions.tolist(),
                    shards.tolist(),
                    locals_.tolist(),
                    strict=True,
                )
            )
        ]
        # Without buckets the caller takes the whole draw; with them, it advances
        # slot by slot as samples join their buckets, and sets these itself.
        if self.bucket_of is None:
            state.slot += count
            for source in np.unique(sources):
                state.positions[source] += int(np.count_nonzero(sources == source))
        return tuple(out)

    def _slot(self, slot: int, source: int, position: int) -> Slot:
        sample_id = int(self.orders[source].sample_ids(position, position + 1)[0])
        shard, local = self.orders[source].locate(sample_id)
        return Slot(slot, source, position, shard, local)
