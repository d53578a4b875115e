"""What runs inside a DataLoader worker: pick this rank's and this worker's
samples from the global stream, fetch them ahead, decode, collate.

Global batch n holds stream positions [start + n*B, start + (n+1)*B). Rank r
takes the r-th slice of B/R positions; worker w of W builds the rank's batches
n = w, w+W, w+2W, ... The DataLoader asks its workers for batches in
round-robin order, so the rank sees batches 0, 1, 2, ... in order, and every
rank sees exactly one batch per global batch: uneven shards cannot make one
rank run out before the others.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from stoker.data.dataset import DataSource
from stoker.data.fetch import FetchedSample, RetryPolicy, SampleFetcher
from stoker.data.loader_stats import LoaderStats
from stoker.data.order import SampleOrder
from stoker.data.prefetch import Prefetcher

Sample = dict[str, Any]
STATS_KEY = "_loader_stats"


@dataclass(frozen=True)
class ClipSpec:
    """How a sample becomes tensors."""

    modalities: tuple[str, ...] = ("video", "audio")
    fps: float = 8.0
    size: tuple[int, int] | None = (64, 64)
    """(height, width) of output frames; None keeps the source size."""
    clip_seconds: float = 1.0
    sample_rate: int = 16_000
    channels: int = 1
    clip_offset: str = "random"
    """random: a start drawn per sample from (seed, position); start: always 0."""


@dataclass(frozen=True)
class StreamPlan:
    """Everything that decides which samples a worker yields."""

    batch_size: int
    """Global batch size: samples per step across all ranks."""
    rank: int
    world_size: int
    start: int
    """Stream position of the first sample of the first batch."""
    seed: int
    max_batches: int | None = None
    shuffle: bool = True
    shuffle_shards: int = 4

    @property
    def per_rank(self) -> int:
        return self.batch_size // self.world_size

    def positions(self, n: int) -> range:
        """Stream positions of this rank's slice of global batch n."""
        first = self.start + n * self.batch_size + self.rank * self.per_rank
        return range(first, first + self.per_rank)


@dataclass
class StreamDataset(IterableDataset[Sample]):
    source: DataSource
    plan: StreamPlan
    clip: ClipSpec
    transform: Callable[[Sample], Sample] | None = None
    prefetch_bytes: int = 256 << 20
    fetch_threads: int = 4
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __iter__(self) -> Iterator[Sample]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        stats = LoaderStats()
        order = SampleOrder(
            tuple(s.samples for s in self.source.manifest.shards),
            seed=self.plan.seed,
            fingerprint=self.source.manifest.fingerprint(),
            shuffle=self.plan.shuffle,
            shuffle_shards=self.plan.shuffle_shards,
        )
        fetcher = SampleFetcher(self.source, self.clip.modalities, stats, self.retry)

        def batch_numbers() -> Iterator[int]:
            n = worker
            while self.plan.max_batches is None or n < self.plan.max_batches:
                yield n
                n += workers

        def items() -> Iterator[tuple[int, int, int, int]]:
            for n in batch_numbers():
                positions = self.plan.positions(n)
                ids = order.sample_ids(positions.start, positions.stop)
                for position, sample_id in zip(positions, ids, strict=True):
                    shard, local = order.locate(int(sample_id))
                    yield n, position, shard, local

        def fetch(item: tuple[int, int, int, int]) -> FetchedSample:
            _, position, shard, local = item
            return fetcher.fetch(position, shard, local)

        prefetcher = Prefetcher(
            fetch,
            items(),
            estimate_bytes=lambda item: fetcher.estimate_bytes(item[2]),
            budget_bytes=self.prefetch_bytes // max(1, workers),
            threads=self.fetch_threads,
        )
        current: int | None = None
        pending: list[tuple[int, Sample | None]] = []
        skipped: list[str] = []
        for (n, position, shard, local), fetched, error, waited in prefetcher:
            if current is not None and n != current:
                yield self._collate(pending, skipped, current, stats)
                pending, skipped = [], []
            current = n
            stats.fetch_s += waited
            sample = None
            if fetched is not None and error is None:
                # Counted as consumed, not as prefetched: bytes/s then matches samples/s.
                stats.bytes_read += sum(len(b) for b in fetched.members.values())
                sample = self._decode(fetched, position, stats)
            if sample is None:
                stats.skipped_samples += 1
                key = fetched.entry.key if fetched is not None else f"#{local}"
                skipped.append(f"{self.source.manifest.shards[shard].path}:{key}")
            pending.append((position, sample))
        if current is not None:
            yield self._collate(pending, skipped, current, stats)

    def _decode(self, fetched: FetchedSample, position: int, stats: LoaderStats) -> Sample | None:
        from stoker.data.decode import clip_start, decode_audio, decode_video
        from stoker.data.probe import MediaError

        entry = fetched.entry
        clip = self.clip
        if clip.clip_offset == "random":
            u = float(np.random.default_rng([self.plan.seed % 2**64, position, 1]).random())
        else:
            u = 0.0
        start = clip_start(entry.duration_s, clip.clip_seconds, u)
        sample: Sample = {"key": entry.key, "position": position}
        began = time.perf_counter()
        try:
            known = entry.unreadable(clip.modalities)
            if known is not None:
                raise MediaError(known)  # found at indexing time; nothing was fetched
            if "video" in clip.modalities:
                assert entry.video is not None
                video = decode_video(
                    fetched.members[entry.video.field],
                    fps=clip.fps,
                    size=clip.size,
                    start_s=start,
                    clip_seconds=clip.clip_seconds,
                    info=entry.video,
                )
                sample["video"] = torch.from_numpy(video)
                stats.video_frames += int(video.shape[0])
            if "audio" in clip.modalities:
                assert entry.audio is not None
                audio = decode_audio(
                    fetched.members[entry.audio.field],
                    field=entry.audio.field,
                    sample_rate=clip.sample_rate,
                    channels=clip.channels,
                    start_s=start,
                    clip_seconds=clip.clip_seconds,
                    info=entry.audio,
                )
                sample["audio"] = torch.from_numpy(audio)
            if "text" in clip.modalities:
                sample["text"] = fetched.members["txt"].decode("utf-8", errors="replace")
            if "meta" in clip.modalities:
                import json

                sample["meta"] = json.loads(fetched.members["json"])
        except (MediaError, ValueError, KeyError, UnicodeDecodeError) as exc:
            import logging

            logging.getLogger("stoker.data").warning(
                "stoker.data: skipping sample %r of %s: %s",
                entry.key,
                self.source.shard_path(fetched.shard),
                exc,
            )
            return None
        finally:
            stats.decode_s += time.perf_counter() - began
        if entry.duration_s + 1e-6 < clip.clip_seconds:
            stats.short_samples += 1  # decoded, padded to the clip length
        if self.transform is not None:
            sample = self.transform(sample)
        stats.samples += 1
        return sample

    def _collate(
        self,
        pending: list[tuple[int, Sample | None]],
        skipped: list[str],
        n: int,
        stats: LoaderStats,
    ) -> Sample:
        good = [s for _, s in pending if s is not None]
        if not good:
            raise RuntimeError(
                f"every sample of batch {n} on rank {self.plan.rank} failed to fetch or decode "
                f"(positions {pending[0][0]}..{pending[-1][0]} of {self.source.url}); "
                "see the warnings above: is the store reachable?"
            )
        # A skipped sample's slot takes a copy of a good one from the same batch, so
        # shapes stay fixed; `valid` tells the loss which rows are real.
        filled = [s if s is not None else good[i % len(good)] for i, (_, s) in enumerate(pending)]
        valid = torch.tensor([s is not None for _, s in pending])
        batch: Sample = {}
        for name in filled[0]:
            if name == "position":
                continue
            values = [s[name] for s in filled]
            batch[name] = torch.stack(values) if isinstance(values[0], torch.Tensor) else values
        batch["position"] = torch.tensor([p for p, _ in pending], dtype=torch.int64)
        batch["valid"] = valid
        # `shard path:key` of each sample skipped in this batch (also logged and counted).
        batch["skipped"] = skipped
        info = get_worker_info()
        batch[STATS_KEY] = (info.id if info is not None else 0, stats.as_dict())
        return batch
