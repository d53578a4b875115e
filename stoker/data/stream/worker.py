"""What runs inside a DataLoader worker: pick this rank's and this worker's
samples from the global batch schedule, fetch them ahead, decode, collate.

The schedule (stoker/data/stream/schedule.py) says which samples make up global batch n:
the next B slots of the merged stream, or with buckets the next bucket to fill. Rank
r takes the r-th slice of B/R of them; worker w of W builds the rank's batches n = w,
w+W, w+2W, ... (every worker walks the whole schedule, which reads only indexes, and
decodes only its own batches). The DataLoader asks its workers for batches in
round-robin order, so the rank sees batches 0, 1, 2, ... in order, and every rank
sees exactly one batch per global batch: uneven shards cannot make one rank run out
before the others. Each batch carries the schedule's state after it, which is what
the loader's state_dict saves.

A `transform` (data.transform: package.module:function) runs on each decoded sample
in the worker; given as its import path, the worker imports it by name (a function
never travels pickled between processes)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from stoker.data.format.latent_format import LATENT_MEMBER
from stoker.data.sets.buckets import Bucket, bucket_ids
from stoker.data.sets.source import DataSource
from stoker.data.stream.fetch import FetchedSample, RetryPolicy, SampleFetcher, ShardFailed
from stoker.data.stream.loader_stats import LoaderStats
from stoker.data.stream.order import SampleOrder
from stoker.data.stream.prefetch import Prefetcher, map_ahead
from stoker.data.stream.schedule import BatchSchedule, GlobalBatch, ScheduleState, Slot
from stoker.data.stream.shared_batch import BufferPool, SharedBatch
from stoker.errors import StokerError
from stoker.import_path import import_callable, last_frame
from stoker.modes import Mixing

if TYPE_CHECKING:
    from stoker.config import DataConfig

log = logging.getLogger("stoker.data")

Sample = dict[str, Any]
Transform = Callable[[Sample], Sample]
STATS_KEY = "_loader_stats"
STATE_KEY = "_loader_state"  # the schedule's state after the batch


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
    clip_offset: Literal["random", "start"] = "random"
    """random: a start drawn per sample from (seed, position); start: always 0."""
    resize: Literal["crop", "stretch"] = "crop"
    """crop: scale to cover `size` keeping the aspect ratio, centre-crop; stretch: scale."""
    arrays: tuple[str, ...] = ()
    """Member extensions passed through as tensors (`npy`, `latent.npy`, `safetensors`)."""

    @classmethod
    def from_data(cls, data: DataConfig) -> ClipSpec:
        """The clip settings of an experiment's `data.*` keys, made once here rather than
        copied field by field (buckets set their own size and length per sample)."""
        return cls(
            modalities=tuple(data.modalities),
            fps=data.fps,
            size=(data.resolution[0], data.resolution[1]),
            clip_seconds=data.clip_seconds,
            sample_rate=data.sample_rate,
            channels=data.channels,
            clip_offset=data.clip_offset,
            resize=data.resize,
        )


@dataclass(frozen=True)
class StreamPlan:
    """Everything that decides which samples a worker yields."""

    batch_sizes: tuple[int, ...]
    """Global batch size per bucket (one entry without buckets): samples per batch
    across all ranks."""
    rank: int
    world_size: int
    state: dict[str, Any]
    """The schedule's state (ScheduleState.as_dict) the first batch follows."""
    seed: int
    max_batches: int | None = None
    shuffle: bool = True
    shuffle_shards: int = 4
    mixing: Mixing = "random"
    weights: tuple[float, ...] = (1.0,)
    buckets: tuple[Bucket, ...] = ()

    def rows(self, global_size: int) -> slice:
        """This rank's rows of a global batch of `global_size`."""
        per_rank = global_size // self.world_size
        return slice(self.rank * per_rank, (self.rank + 1) * per_rank)


class _Skip(Exception):
    """A sample that must not be trained on, and why."""


@dataclass
class _Decoded:
    """What a decode thread hands the worker's loop for one sample: its tensors (None
    when it must be skipped, and why), and its counts, which the loop's thread adds to
    the worker's LoaderStats (the decode threads never touch them)."""

    sample: Sample | None
    reason: str = ""
    decode_s: float = 0.0
    video_frames: int = 0
    short: bool = False


class _Row(NamedTuple):
    """One of this rank's rows of a global batch: what the prefetcher fetches."""

    batch: GlobalBatch
    slot: Slot
    last: bool
    """The batch's last row on this rank: the batch is collated once it is taken."""


_Prefetched = tuple[_Row, FetchedSample | None, BaseException | None, float]
"""What the prefetcher yields for a row: (row, its bytes, the fetch's error, seconds waited)."""


@dataclass
class StreamDataset(IterableDataset[Sample]):
    sources: tuple[DataSource, ...]
    plan: StreamPlan
    clip: ClipSpec
    transform: Transform | str | None = None
    """A function, or the import path of one (imported by name in each worker)."""
    prefetch_bytes: int = 256 << 20
    fetch_threads: int = 4
    decode_threads: int = 1
    """Threads decoding ahead of the loop in each worker (stoker/data/stream/prefetch.py
    map_ahead); 1: the loop decodes. The transform always runs in the loop's thread."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    names: tuple[str, ...] = ()
    """The sources' names (data.sources), for batches and messages; () for one source."""
    leases: torch.Tensor | None = None
    """The main process's hand-back bytes for the workers' pooled batch buffers
    (stoker/data/stream/shared_batch.py); None: a new buffer every batch."""

    def __iter__(self) -> Iterator[Sample]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        pool = (
            BufferPool(worker, self.leases)
            if info is not None and self.leases is not None
            else None
        )
        transform = self._transform()
        stats = LoaderStats()
        fetchers = [
            SampleFetcher(source, self.clip.modalities, stats, self.retry, arrays=self.clip.arrays)
            for source in self.sources
        ]
        schedule = BatchSchedule(
            orders=[self._order(source) for source in self.sources],
            batch_sizes=self.plan.batch_sizes,
            seed=self.plan.seed,
            mixing=self.plan.mixing,
            weights=self.plan.weights,
            bucket_of=[self._bucket_of(f) for f in fetchers] if self.plan.buckets else None,
        )
        start = ScheduleState.from_dict(self.plan.state)

        def rows() -> Iterator[_Row]:
            for n, batch in enumerate(schedule.batches(start)):
                if self.plan.max_batches is not None and n >= self.plan.max_batches:
                    return
                if n % workers != worker:
                    continue  # another worker's batch: its composition was all we needed
                mine = batch.slots[self.plan.rows(len(batch.slots))]
                for i, slot in enumerate(mine):
                    yield _Row(batch, slot, last=i == len(mine) - 1)

        def fetch(row: _Row) -> FetchedSample:
            slot = row.slot
            return fetchers[slot.source].fetch(slot.slot, slot.shard, slot.local)

        prefetcher = Prefetcher(
            fetch,
            rows(),
            estimate_bytes=lambda row: fetchers[row.slot.source].estimate_bytes(row.slot.shard),
            budget_bytes=self.prefetch_bytes // max(1, workers),
            threads=self.fetch_threads,
        )
        pending: list[tuple[Slot, Sample | None]] = []
        skipped: list[str] = []
        reason = ""  # why the latest skipped sample was skipped

        def decode(prefetched: _Prefetched) -> _Decoded | None:
            row, fetched, error, _ = prefetched
            if fetched is None or error is not None:
                return None
            began = time.perf_counter()
            try:
                decoded = self._decode_media(fetched, row.slot.slot, row.batch.bucket)
            except _Skip as skip:
                decoded = _Decoded(None, reason=str(skip))
            decoded.decode_s = time.perf_counter() - began
            return decoded

        for (row, fetched, error, waited), decoded in map_ahead(
            iter(prefetcher), decode, self.decode_threads
        ):
            slot = row.slot
            stats.fetch_s += waited
            sample = None
            source = self.sources[slot.source]
            if fetched is None or error is not None:
                reason = f"fetch failed: {error}"  # the fetcher logged it
            else:
                # Counted as consumed, not as prefetched: bytes/s then matches samples/s.
                stats.bytes_read += sum(len(b) for b in fetched.members.values())
                assert decoded is not None
                stats.decode_s += decoded.decode_s
                try:
                    if decoded.sample is None:
                        raise _Skip(decoded.reason)
                    sample = self._finished(decoded, fetched, stats, transform, source)
                except _Skip as skip:
                    reason = str(skip)
                    log.warning(
                        "stoker.data: skipping sample %r of %s: %s",
                        fetched.entry.key,
                        source.shard_path(fetched.shard),
                        reason,
                    )
            if sample is None:
                stats.skipped_samples += 1
                key = fetched.entry.key if fetched is not None else f"#{slot.local}"
                skipped.append(f"{source.manifest.shards[slot.shard].path}:{key}")
            pending.append((slot, sample))
            if row.last:  # not at the next batch's first row: that may be decoding still
                yield self._collate(pending, skipped, row.batch, stats, reason, pool)
                pending, skipped = [], []

    def _order(self, source: DataSource) -> SampleOrder:
        return SampleOrder(
            tuple(s.samples for s in source.manifest.shards),
            seed=self.plan.seed,
            fingerprint=source.manifest.fingerprint(),
            shuffle=self.plan.shuffle,
            shuffle_shards=self.plan.shuffle_shards,
        )

    def _bucket_of(self, fetcher: SampleFetcher) -> Callable[[int, int], int]:
        """(shard, sample) -> bucket, from the shard's index (read once, kept per shard).
        An index that cannot be read stops the loader: every rank and worker must put
        every sample in the same bucket, and one that guessed would not."""
        buckets = self.plan.buckets
        video = "video" in self.clip.modalities
        cache: dict[int, list[int]] = {}

        def bucket_of(shard: int, local: int) -> int:
            ids = cache.get(shard)
            if ids is None:
                try:
                    index = fetcher.index(shard)
                except ShardFailed as exc:
                    raise StokerError(
                        f"cannot bucket the samples of {fetcher.source.shard_path(shard)}: "
                        f"its index does not read ({exc})",
                        fix="restore the shard's index (with buckets every rank must read "
                        "every index it draws from), or repack the data set",
                    ) from exc
                if len(cache) >= 1024:
                    cache.pop(next(iter(cache)))
                ids = cache[shard] = bucket_ids(index.samples, buckets, video=video)
            return ids[local]

        return bucket_of

    @property
    def transform_name(self) -> str:
        """How messages name the transform: its import path."""
        if self.transform is None or isinstance(self.transform, str):
            return self.transform or ""
        return f"{self.transform.__module__}:{getattr(self.transform, '__qualname__', '?')}"

    def _transform(self) -> tuple[Transform, str] | None:
        """The transform and its name; a path is imported here, in the worker."""
        if self.transform is None:
            return None
        if isinstance(self.transform, str):
            return import_transform(self.transform), self.transform
        return self.transform, self.transform_name

    def _decode_media(self, fetched: FetchedSample, position: int, bucket: int) -> _Decoded:
        """The sample's tensors, before the transform; _Skip when it must not be trained
        on. Touches nothing shared: it runs in the decode threads (map_ahead)."""
        from stoker.data.media.decode import clip_start, decode_array, decode_audio, decode_video
        from stoker.data.media.errors import MediaError

        entry = fetched.entry
        clip = self.clip
        if self.plan.buckets:
            shape = self.plan.buckets[bucket]
            clip = replace(clip, size=shape.resolution, clip_seconds=shape.clip_seconds)
        if clip.clip_offset == "random":
            u = float(np.random.default_rng([self.plan.seed % 2**64, position, 1]).random())
        else:
            u = 0.0
        start = clip_start(entry.duration_s, clip.clip_seconds, u)
        sample: Sample = {"key": entry.key, "position": position}
        frames = 0
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
                    resize=clip.resize,
                    start_s=start,
                    clip_seconds=clip.clip_seconds,
                    info=entry.video,
                )
                sample["video"] = torch.from_numpy(video)
                frames = int(video.shape[0])
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
            if "latent" in clip.modalities:  # the encoder's tensors by name
                sample["latent"] = decode_array(fetched.members[LATENT_MEMBER], LATENT_MEMBER)
            for name in clip.arrays:  # under its extension: batch["latent.npy"]
                sample[name] = decode_array(fetched.members[name], name)
        except (MediaError, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise _Skip(str(exc)) from exc
        return _Decoded(
            sample,
            video_frames=frames,
            short=entry.duration_s + 1e-6 < clip.clip_seconds,
        )

    def _finished(
        self,
        decoded: _Decoded,
        fetched: FetchedSample,
        stats: LoaderStats,
        transform: tuple[Transform, str] | None,
        source: DataSource,
    ) -> Sample:
        """A decoded sample, transformed, in stream order in the worker's own thread (a
        user's transform need not be thread-safe); _Skip when the transform fails."""
        sample = decoded.sample
        assert sample is not None
        if decoded.short:
            stats.short_samples += 1  # decoded, padded to the clip length
        if transform is not None:
            sample = self._transformed(
                sample, transform, f"{source.shard_path(fetched.shard)}:{fetched.entry.key}"
            )
        stats.samples += 1
        stats.video_frames += decoded.video_frames  # delivered: not a skipped sample's
        return sample

    def _transformed(self, sample: Sample, transform: tuple[Transform, str], where: str) -> Sample:
        function, name = transform
        try:
            out = function(sample)
        except Exception as exc:
            # Skipped as a corrupt sample is, not fatal: the untransformed sample is
            # not what the model expects, so it must not be trained on either way,
            # and one odd sample in millions must not end a job hours in. A transform
            # that fails on every sample still stops at the first batch (_collate).
            raise _Skip(
                f"transform {name} raised {type(exc).__name__}: {exc} [{last_frame(exc)}]"
            ) from exc
        if not isinstance(out, dict):
            # A bug in the transform, the same for every sample: stop, do not skip.
            raise StokerError(
                f"transform {name} returned {type(out).__name__}, not a sample dict "
                f"(sample {where})",
                fix="return the sample: the dict the function got (changed) or a new dict",
            )
        return out

    def _collate(
        self,
        pending: list[tuple[Slot, Sample | None]],
        skipped: list[str],
        batch: GlobalBatch,
        stats: LoaderStats,
        reason: str,
        pool: BufferPool | None = None,
    ) -> Sample:
        good = [s for _, s in pending if s is not None]
        if not good:
            where = ", ".join(dict.fromkeys(self.sources[s.source].url for s, _ in pending))
            raise RuntimeError(
                f"every sample of batch {batch.after.batches - 1} on rank {self.plan.rank} "
                f"failed to fetch, decode or transform (positions {pending[0][0].slot}.."
                f"{pending[-1][0].slot} of {where}); the last: {reason} (the warnings above "
                "name each)"
            )
        names = list(good[0])
        for other in good[1:]:
            if set(other) != set(names):
                raise StokerError(
                    f"samples {good[0].get('key')!r} and {other.get('key')!r} have different "
                    f"keys ({sorted(names)} and {sorted(other)}): a batch needs each key in "
                    "every row" + (f" (transform {self.transform_name})" if self.transform else ""),
                    fix="return the same keys for every sample from the transform",
                )
        # A skipped sample's slot takes a copy of a good one from the same batch, so
        # shapes stay fixed; `valid` tells the loss which rows are real.
        filled = [s if s is not None else good[i % len(good)] for i, (_, s) in enumerate(pending)]
        valid = torch.tensor([s is not None for _, s in pending])
        position = torch.tensor([slot.slot for slot, _ in pending], dtype=torch.int64)
        info = get_worker_info()
        # In a worker, the batch's tensors go to the main process as one shared buffer.
        shared = SharedBatch() if info is not None else None
        stack = shared.stack if shared is not None else torch.stack
        out: Sample = {}
        for name in names:
            if name == "position":
                continue
            out[name] = collate([s[name] for s in filled], stack)
        out["position"] = shared.add(position) if shared is not None else position
        out["valid"] = shared.add(valid) if shared is not None else valid
        if shared is not None:
            shared.fill(out, pool)
        # `shard path:key` of each sample skipped in this batch (also logged and counted).
        out["skipped"] = skipped
        if self.names:
            out["source"] = [self.names[slot.source] for slot, _ in pending]
        if self.plan.buckets:
            out["bucket"] = self.plan.buckets[batch.bucket].name
        out[STATS_KEY] = (info.id if info is not None else 0, stats.as_dict())
        out[STATE_KEY] = batch.after.as_dict()
        return out


def collate(values: list[Any], stack: Callable[[list[torch.Tensor]], Any] = torch.stack) -> Any:
    """One key's values across a batch's rows: tensors of one shape and dtype stacked
    ([B, ...], by `stack`), other tensors a list; dicts of tensors (a `.safetensors`
    member) with the same names in every row a dict of these, name by name; anything
    else a list."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        if all(
            isinstance(v, torch.Tensor) and v.shape == first.shape and v.dtype == first.dtype
            for v in values
        ):
            return stack(values)
        return list(values)
    if (
        isinstance(first, dict)
        and first
        and all(isinstance(t, torch.Tensor) for t in first.values())
        and all(isinstance(v, dict) and v.keys() == first.keys() for v in values)
    ):
        return {name: collate([v[name] for v in values], stack) for name in first}
    return list(values)


def import_transform(path: str, key: str = "transform") -> Transform:
    """The function `path` (package.module:function) names, imported by name; a
    StokerError naming `key` (the setting), the value and the fix when it does not."""
    function: Transform = import_callable(
        path,
        key=key,
        noun="functions",
        kind="a function",
        kind_fix="name the function that takes a sample dict and returns one",
    )
    return function
