"""Fetch one sample's bytes: a range read of its members, found through the shard
index, with retries and backoff; a shard that keeps failing is given up on.

One range request per sample (its members lie next to each other in the tar)
means a rank reads only its own samples: with R ranks and W workers each, a
whole-shard reader would move every byte R x W times.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stoker.data.format.latent_format import LATENT_MEMBER
from stoker.data.format.shard_format import CAPTION_EXT, METADATA_EXT, SampleEntry, ShardIndex
from stoker.data.sets.source import DataSource
from stoker.data.stream.loader_stats import LoaderStats

log = logging.getLogger("stoker.data")

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    """Tries per request, the first included."""
    backoff_s: float = 0.5
    """First wait; doubled after each failure, with +-50% jitter, capped at max_backoff_s."""
    max_backoff_s: float = 8.0


@dataclass
class FetchedSample:
    sample_id: int
    shard: int
    entry: SampleEntry
    members: dict[str, bytes]
    """Bytes by extension, only the members the loader asked for."""


class ShardFailed(Exception):
    """A shard could not be read after all retries."""


def members_for(
    entry: SampleEntry, modalities: tuple[str, ...], arrays: tuple[str, ...] = ()
) -> list[str]:
    """The member extensions of `entry` that `modalities` need, then its `arrays`."""
    names = []
    for modality in modalities:
        if modality == "video" and entry.video is not None:
            names.append(entry.video.field)
        elif modality == "audio" and entry.audio is not None:
            names.append(entry.audio.field)
        elif modality == "text" and CAPTION_EXT in entry.members:
            names.append(CAPTION_EXT)
        elif modality == "meta" and METADATA_EXT in entry.members:
            names.append(METADATA_EXT)
        elif modality == "latent" and LATENT_MEMBER in entry.members:
            names.append(LATENT_MEMBER)
    return names + [a for a in arrays if a in entry.members]


class SampleFetcher:
    """Thread-safe: the prefetcher calls `fetch` from several threads."""

    def __init__(
        self,
        source: DataSource,
        modalities: tuple[str, ...],
        stats: LoaderStats,
        retry: RetryPolicy | None = None,
        max_cached_indexes: int = 64,
        arrays: tuple[str, ...] = (),
    ) -> None:
        self.source = source
        self.modalities = modalities
        self.arrays = arrays
        self.stats = stats
        self.retry = retry or RetryPolicy()
        self._max_cached = max_cached_indexes
        self._indexes: dict[int, ShardIndex] = {}
        self._failed: set[int] = set()
        self._lock = threading.Lock()
        self._shard_locks: dict[int, threading.Lock] = {}
        self._read = _read_local if _is_local(source.fs) else source.fs.cat_file

    def _with_retries(self, what: str, shard: int, call: Callable[[], T]) -> T:
        delay = self.retry.backoff_s
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return call()
            except Exception as exc:  # any storage error: the store decides what is transient
                if attempt == self.retry.attempts:
                    self._give_up(shard, what, exc)
                    raise ShardFailed(f"{what}: {exc}") from exc
                with self._lock:
                    self.stats.fetch_retries += 1
                log.warning(
                    "stoker.data: %s failed (%s: %s); retry %d/%d in %.1fs",
                    what,
                    type(exc).__name__,
                    exc,
                    attempt,
                    self.retry.attempts - 1,
                    delay,
                )
                time.sleep(delay * random.uniform(0.5, 1.5))
                delay = min(delay * 2, self.retry.max_backoff_s)
        raise AssertionError("unreachable")

    def _give_up(self, shard: int, what: str, exc: BaseException) -> None:
        with self._lock:
            if shard in self._failed:
                return
            self._failed.add(shard)
            self.stats.failed_shards += 1
        log.error(
            "stoker.data: giving up on shard %s after %d tries (%s: %s: %s); "
            "its samples are skipped",
            self.source.shard_path(shard),
            self.retry.attempts,
            what,
            type(exc).__name__,
            exc,
        )

    def index(self, shard: int) -> ShardIndex:
        with self._lock:
            if shard in self._failed:
                raise ShardFailed(f"shard {shard} failed earlier")
            cached = self._indexes.get(shard)
            if cached is not None:
                return cached
            shard_lock = self._shard_locks.setdefault(shard, threading.Lock())
        with shard_lock:  # one GET per index, however many threads want it
            with self._lock:
                cached = self._indexes.get(shard)
            if cached is not None:
                return cached
            index = self._with_retries(
                f"index of {self.source.shard_path(shard)}",
                shard,
                lambda: self.source.read_index(shard),
            )
            expected = self.source.manifest.shards[shard].samples
            if len(index.samples) != expected:
                exc = ValueError(
                    f"index lists {len(index.samples)} samples, the manifest {expected}"
                )
                self._give_up(shard, "index check", exc)
                raise ShardFailed(str(exc))
            with self._lock:
                if len(self._indexes) >= self._max_cached:
                    self._indexes.pop(next(iter(self._indexes)))
                self._indexes[shard] = index
            return index

    def estimate_bytes(self, shard: int) -> int:
        """Expected bytes of one sample of `shard`, before its index is read."""
        record = self.source.manifest.shards[shard]
        return record.bytes // max(1, record.samples)

    def fetch(self, sample_id: int, shard: int, local: int) -> FetchedSample:
        """The sample's members; raises ShardFailed when its shard cannot be read."""
        entry = self.index(shard).samples[local]
        names = members_for(entry, self.modalities, self.arrays)
        if not names or entry.unreadable(self.modalities):  # nothing to read, or no use
            return FetchedSample(sample_id, shard, entry, {})
        spans = [entry.members[n] for n in names]
        start = min(m.offset for m in spans)
        end = max(m.offset + m.size for m in spans)
        path = self.source.shard_path(shard)
        data = self._with_retries(
            f"bytes {start}-{end} of {path}",
            shard,
            lambda: self._read(path, start=start, end=end),
        )
        if len(data) != end - start:
            exc = ValueError(f"short read: {len(data)} of {end - start} bytes")
            self._give_up(shard, f"bytes {start}-{end} of {path}", exc)
            raise ShardFailed(str(exc))
        members = {
            n: data[
                entry.members[n].offset - start : entry.members[n].offset
                - start
                + entry.members[n].size
            ]
            for n in names
        }
        return FetchedSample(sample_id, shard, entry, members)


def _is_local(fs: object) -> bool:
    from fsspec.implementations.local import LocalFileSystem  # type: ignore[import-untyped, unused-ignore]

    return isinstance(fs, LocalFileSystem)


def _read_local(path: str, *, start: int, end: int) -> bytes:
    """Bytes [start, end) of a local file, as LocalFileSystem.cat_file reads them (fewer
    at its end), in one pread: cat_file makes a file object a call (its path checked
    and normalized, a buffered reader), 86 us of CPU for a 268 KB latent sample here
    against 45."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.pread(fd, end - start, start)
    finally:
        os.close(fd)
