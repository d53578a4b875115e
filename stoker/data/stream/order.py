"""The global sample stream: which sample sits at each position, for every epoch.

The stream is the concatenation of one permutation of the data set per epoch;
position p is sample `order[p // N][p % N]`. It depends on (seed, epoch,
manifest) and nothing else: not on ranks, workers, batch size or wall time.
That is what lets a job resume on another number of GPUs and continue exactly
where it stopped: the loader's state is a position in this stream.

Shuffling is two-level, as in MosaicML Streaming: shards are permuted, cut into
blocks of `shuffle_shards` shards, and samples are permuted within a block. A
worker then needs the indexes of a few shards at a time, never all of them,
and nothing of the order needs memory in proportion to the data set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class SampleOrder:
    """Maps stream positions to (shard, sample-in-shard) pairs."""

    shard_sizes: tuple[int, ...]
    """Samples per shard, in manifest order."""
    seed: int
    fingerprint: str
    """Manifest fingerprint: a different data set gives a different order."""
    shuffle: bool = True
    shuffle_shards: int = 4
    """Shards whose samples are mixed together; larger mixes better, fetches wider."""
    _blocks: dict[tuple[int, int], np.ndarray] = field(
        default_factory=dict, repr=False, compare=False
    )
    _epochs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.samples_per_epoch == 0:
            raise ValueError("the data set has no samples")
        if self.shuffle_shards < 1:
            raise ValueError(f"shuffle_shards must be >= 1, got {self.shuffle_shards}")

    @cached_property
    def samples_per_epoch(self) -> int:
        return int(sum(self.shard_sizes))

    @cached_property
    def _shard_starts(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(self.shard_sizes, dtype=np.int64)])

    def _rng(self, *words: int) -> np.random.Generator:
        return np.random.default_rng([self.seed % 2**64, int(self.fingerprint, 16), *words])

    def _epoch(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shard order, block start positions (in samples), and each block's shard range."""
        cached = self._epochs.get(epoch)
        if cached is not None:
            return cached
        n = len(self.shard_sizes)
        shards = self._rng(epoch, 0).permutation(n) if self.shuffle else np.arange(n)
        k = self.shuffle_shards if self.shuffle else n
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)[shards]
        first_shard = np.arange(0, n, k)
        block_sizes = np.add.reduceat(sizes, first_shard)
        block_starts = np.concatenate([[0], np.cumsum(block_sizes)])
        if len(self._epochs) > 2:
            self._epochs.clear()
        self._epochs[epoch] = (shards, block_starts, first_shard)
        return self._epochs[epoch]

    def _block(self, epoch: int, block: int) -> np.ndarray:
        """Global sample ids of one block, in stream order."""
        cached = self._blocks.get((epoch, block))
        if cached is not None:
            return cached
        shards, _, first_shard = self._epoch(epoch)
        k = self.shuffle_shards if self.shuffle else len(self.shard_sizes)
        members = shards[first_shard[block] : first_shard[block] + k]
        starts = self._shard_starts
        ids = np.concatenate([np.arange(starts[s], starts[s + 1]) for s in members])
        if self.shuffle:
            ids = self._rng(epoch, 1, block).permutation(ids)
        if len(self._blocks) > 8:
            self._blocks.clear()
        self._blocks[(epoch, block)] = ids
        return ids

    def sample_ids(self, start: int, stop: int) -> np.ndarray:
        """Global sample ids (index into the manifest's concatenated shards) at
        stream positions [start, stop)."""
        if start < 0 or stop < start:
            raise ValueError(f"bad stream range [{start}, {stop})")
        out = np.empty(stop - start, dtype=np.int64)
        n = self.samples_per_epoch
        pos = start
        while pos < stop:
            epoch, offset = divmod(pos, n)
            _, block_starts, _ = self._epoch(epoch)
            block = int(np.searchsorted(block_starts, offset, side="right")) - 1
            ids = self._block(epoch, block)
            lo = offset - int(block_starts[block])
            take = min(len(ids) - lo, stop - pos)
            out[pos - start : pos - start + take] = ids[lo : lo + take]
            pos += take
        return out

    def locate_all(self, sample_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`locate` of each of `sample_ids`: their shard numbers and sample numbers."""
        shards = np.searchsorted(self._shard_starts, sample_ids, side="right") - 1
        return shards, sample_ids - self._shard_starts[shards]

    def locate(self, sample_id: int) -> tuple[int, int]:
        """(shard number, sample number within the shard) of a global sample id."""
        shard = int(np.searchsorted(self._shard_starts, sample_id, side="right")) - 1
        return shard, int(sample_id - self._shard_starts[shard])
