"""The loader a training loop holds: a DataLoader over the global batch schedule,
with a resumable state.

    loader = StreamingLoader("s3://bucket/av", batch_size=32, rank=rank, world_size=world)
    loader.load_state_dict(checkpoint["loader"])      # after a restart, any world size
    for step, batch in zip(range(steps), loader):
        ...                                            # batch["video"]: B/R x T x 3 x H x W uint8
        checkpoint["loader"] = loader.state_dict()

One data set, or a mixture (`MixSource`s with weights, each with its own epochs), and
optionally buckets of clip size and length (stoker/data/stream/schedule.py). The state is the
schedule's state after the last batch the loop has taken (each batch brings it from its
worker), never what workers prefetched. Resuming with other numbers of ranks or
workers continues the same schedule: nothing repeated, nothing skipped."""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal

from stoker.data.format.latent_format import LATENT_MEMBER
from stoker.data.format.shard_format import MODALITIES
from stoker.data.media.decode import array_fields
from stoker.data.sets.buckets import Bucket, bucket_counts, encoded_buckets, resolve_buckets
from stoker.data.sets.dataset import open_dataset
from stoker.data.sets.source import DataSource
from stoker.data.stream import loader_state, shared_batch
from stoker.data.stream.fetch import RetryPolicy
from stoker.data.stream.loader_stats import LoaderStats
from stoker.data.stream.parent_death import STOP_SIGNALS, die_with_parent
from stoker.data.stream.prefetch import auto_decode_threads
from stoker.data.stream.schedule import ScheduleState
from stoker.data.stream.worker import (
    STATE_KEY,
    STATS_KEY,
    ClipSpec,
    Sample,
    StreamDataset,
    StreamPlan,
    Transform,
    import_transform,
)
from stoker.errors import StokerError
from stoker.modes import Mixing
from stoker.process.environment import adopt_environment, environment_now

START_METHODS = ("forkserver", "spawn")


@dataclass(frozen=True)
class MixSource:
    """One data set of a mixture: its name, where it is, its share of the samples."""

    name: str
    data: str | DataSource
    weight: float = 1.0


class StreamingLoader:
    """Batches of this rank's slice of the global batch schedule, resumable and elastic.

    `data` is one data set (URL or DataSource) or a mixture (a list of MixSource, each
    walked in its own order with its own epochs, `mixing` random or exact). `buckets`
    batch clips of several sizes and lengths, each bucket with its own global batch
    size (`batch_size` is then unused). `clip`: the clip settings as one value
    (`ClipSpec.from_data(config.data)`), instead of `modalities` .. `resize` one by one."""

    def __init__(
        self,
        data: str | DataSource | Sequence[MixSource],
        *,
        batch_size: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        num_workers: int = 2,
        seed: int = 0,
        modalities: tuple[str, ...] = ("video", "audio"),
        fps: float = 8.0,
        size: tuple[int, int] | None = (64, 64),
        clip_seconds: float = 1.0,
        sample_rate: int = 16_000,
        channels: int = 1,
        clip_offset: Literal["random", "start"] = "random",
        resize: Literal["crop", "stretch"] = "crop",
        shuffle: bool = True,
        shuffle_shards: int = 4,
        mixing: Mixing = "random",
        buckets: Sequence[Bucket] = (),
        prefetch_mb: float = 256,
        fetch_threads: int = 4,
        decode_threads: int | None = None,
        retry: RetryPolicy | None = None,
        start_method: str = "forkserver",
        storage_options: dict[str, Any] | None = None,
        transform: Transform | str | None = None,
        pin_memory: bool = False,
        allow_changed_data: bool = False,
        source_name: str = "StreamingLoader",
        clip: ClipSpec | None = None,
    ) -> None:
        clip = clip or ClipSpec(
            modalities=tuple(modalities),
            fps=fps,
            size=size,
            clip_seconds=clip_seconds,
            sample_rate=sample_rate,
            channels=channels,
            clip_offset=clip_offset,
            resize=resize,
        )
        # Checked below as given one by one.
        modalities, clip_offset, resize = clip.modalities, clip.clip_offset, clip.resize
        self.mixture = not isinstance(data, (str, DataSource))
        specs: list[MixSource] = (
            [MixSource("data", data)] if isinstance(data, (str, DataSource)) else list(data)
        )
        if not specs:
            raise StokerError(f"{source_name}: no data set given", fix="name at least one")
        self.names = tuple(spec.name for spec in specs)
        self.weights = tuple(float(spec.weight) for spec in specs)
        self.sources = tuple(
            spec.data
            if isinstance(spec.data, DataSource)
            else open_dataset(spec.data, storage_options)
            for spec in specs
        )
        self.source = self.sources[0]
        where = f"{source_name} of " + ", ".join(s.url for s in self.sources)
        if world_size < 1 or not 0 <= rank < world_size:
            raise StokerError(f"{where}: rank {rank} is not in a world of size {world_size}")
        self.buckets = tuple(buckets)
        if self.buckets:
            for i, bucket in enumerate(self.buckets):
                if bucket.batch_size < world_size or bucket.batch_size % world_size:
                    raise StokerError(
                        f"{where}: bucket {i} ({bucket.name}) has a global batch of "
                        f"{bucket.batch_size}, which does not split over {world_size} ranks",
                        fix=f"give it a batch_size that is a multiple of {world_size} (with "
                        f"data.batch_tokens: data.batch_multiple={world_size})",
                    )
            batch_sizes = tuple(b.batch_size for b in self.buckets)
        else:
            if batch_size is None:
                raise StokerError(f"{where}: batch_size is required without buckets")
            if batch_size < world_size or batch_size % world_size:
                raise StokerError(
                    f"{where}: global batch size {batch_size} does not split over "
                    f"{world_size} ranks",
                    fix=f"use a multiple of {world_size} (each rank takes batch_size / ranks)",
                )
            batch_sizes = (batch_size,)
        self.batch_sizes = batch_sizes
        self.batch_size = batch_sizes[0]
        unknown = [m for m in modalities if m not in MODALITIES]
        if unknown or not modalities:
            raise StokerError(
                f"{where}: unknown modalities {unknown or list(modalities)}",
                fix=f"choose from {', '.join(MODALITIES)}",
            )
        for name, source in zip(self.names, self.sources, strict=True):
            missing = [m for m in modalities if m not in source.manifest.modalities]
            if missing:
                has = ", ".join(source.manifest.modalities) or "nothing"
                named = f"{source_name} {name!r} ({source.url})" if self.mixture else where
                raise StokerError(
                    f"{named}: asks for {', '.join(missing)}, which not every sample of the "
                    f"data set has (it has: {has})",
                    fix="drop those from the loader's modalities, or pack a data set that has them",
                )
        if clip_offset not in ("random", "start"):
            raise StokerError(
                f"{where}: clip_offset {clip_offset!r} is not one of random, start",
                fix="use clip_offset random (training) or start (evaluation)",
            )
        if resize not in ("crop", "stretch"):
            raise StokerError(f"{where}: resize {resize!r} is not one of crop, stretch")
        if mixing not in ("random", "exact"):
            raise StokerError(f"{where}: mixing {mixing!r} is not one of random, exact")
        if start_method not in START_METHODS:
            raise StokerError(
                f"{where}: worker start method {start_method!r} is not one of "
                f"{', '.join(START_METHODS)}",
                fix="fork is refused: fsspec's async filesystems (s3fs, gcsfs) are not fork-safe",
            )
        for source in self.sources:
            protocol = source.fs.protocol
            protocols = protocol if isinstance(protocol, tuple) else (protocol,)
            if num_workers and "memory" in protocols:
                raise StokerError(
                    f"{where}: memory:// lives in one process; DataLoader workers would see it "
                    "empty",
                    fix="use num_workers=0 with memory://",
                )
        if isinstance(transform, str):
            # Here, before any worker starts: each worker imports it again by name.
            import_transform(transform)
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.shuffle_shards = shuffle_shards
        self.mixing = mixing
        fields = set.intersection(*(set(s.manifest.fields) for s in self.sources))
        # A latent data set's tensors come under "latent" (the modality), not as arrays.
        self.clip = replace(clip, arrays=array_fields(sorted(fields - {LATENT_MEMBER})))
        self.prefetch_bytes = int(prefetch_mb * (1 << 20))
        self.fetch_threads = fetch_threads
        if decode_threads is not None and decode_threads < 1:
            raise StokerError(
                f"{where}: decode_threads {decode_threads} is not a number of threads",
                fix="give 1 or more, or None (data.decode_threads: 0): the rank's cores "
                "over its workers, at most 4",
            )
        self.decode_threads = (
            decode_threads if decode_threads is not None else auto_decode_threads(num_workers)
        )
        self.retry = retry or RetryPolicy()
        self.start_method = start_method
        self.transform = transform
        self.pin_memory = pin_memory
        self.allow_changed_data = allow_changed_data
        self.where = where
        self._state = ScheduleState.start(len(self.sources), max(1, len(self.buckets)))
        self._stats_done = LoaderStats()
        self._stats_live: dict[int, LoaderStats] = {}

    @property
    def samples_per_epoch(self) -> int:
        """Samples in one epoch of the first (or only) data set."""
        return self.source.manifest.samples

    @property
    def position(self) -> int:
        """Slots of the merged stream taken so far (with one data set and no buckets:
        the global stream position of the next batch's first sample)."""
        return self._state.slot

    @position.setter
    def position(self, value: int) -> None:
        if value == 0:
            self._state = ScheduleState.start(len(self.sources), max(1, len(self.buckets)))
        elif len(self.sources) == 1 and not self.buckets:
            self._state = ScheduleState(value // self.batch_size, value, [value], [[]])
        else:
            raise StokerError(
                f"{self.where}: a mixture or bucketed loader rewinds only to 0",
                fix="restore a state_dict() instead",
            )

    @property
    def epoch(self) -> int:
        """Epochs of the first (or only) data set taken so far."""
        return self._state.positions[0] // self.samples_per_epoch

    def progress(self) -> dict[str, tuple[int, float]]:
        """Per data set (by name): samples taken from it and its epochs (fractional),
        over the whole run, for metrics."""
        return {
            name: (pos, pos / source.manifest.samples)
            for name, source, pos in zip(
                self.names, self.sources, self._state.positions, strict=True
            )
        }

    def bucket_counts(self, threads: int = 8) -> dict[str, dict[str, int]]:
        """Per data set (by name), its samples per bucket (every bucket named, 0 where
        none falls); {} without buckets. Reads every shard index (in `threads` threads):
        for lineage and reports, never on the training path."""
        if not self.buckets:
            return {}
        from concurrent.futures import ThreadPoolExecutor

        video = "video" in self.clip.modalities
        out = {}
        with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
            for name, source in zip(self.names, self.sources, strict=True):
                counts = dict.fromkeys((b.name for b in self.buckets), 0)
                indexes = pool.map(source.read_index, range(len(source.manifest.shards)))
                for index in indexes:
                    for bucket, n in bucket_counts(
                        index.samples, self.buckets, video=video
                    ).items():
                        counts[bucket] += n
                out[name] = counts
        return out

    def batches(self, max_batches: int | None = None) -> Iterator[Sample]:
        """This rank's next batches, from the current position on (endless by default)."""
        from torch.utils.data import DataLoader

        self._fold_stats()
        workers = self.num_workers
        # Batch buffers go round between the workers and this process (shared_batch.py),
        # but not to the DataLoader's pinning thread, which would copy their places.
        leases = shared_batch.leases(workers) if workers and not self.pin_memory else None
        dataset = StreamDataset(
            sources=self.sources,
            plan=StreamPlan(
                batch_sizes=self.batch_sizes,
                rank=self.rank,
                world_size=self.world_size,
                state=self._state.as_dict(),
                seed=self.seed,
                max_batches=max_batches,
                shuffle=self.shuffle,
                shuffle_shards=self.shuffle_shards,
                mixing=self.mixing,
                weights=self.weights,
                buckets=self.buckets,
            ),
            clip=self.clip,
            transform=self.transform,
            prefetch_bytes=self.prefetch_bytes,
            fetch_threads=self.fetch_threads,
            decode_threads=self.decode_threads,
            retry=self.retry,
            names=self.names if self.mixture else (),
            leases=leases,
        )
        lent = shared_batch.LentBuffers(leases) if leases is not None else None
        loader = DataLoader(
            dataset,
            batch_size=None,  # the dataset yields whole per-rank batches
            num_workers=workers,
            multiprocessing_context=_context(self.start_method) if workers else None,
            prefetch_factor=2 if workers else None,
            persistent_workers=False,
            pin_memory=self.pin_memory,
            worker_init_fn=partial(_init_worker, environment=environment_now())
            if workers
            else None,
        )
        with _stop_signals_held(self.start_method if workers else None):
            it = iter(loader)  # starts the workers
        try:
            for batch in it:
                if lent is not None:
                    lent.hand_back()  # what the loop let go of since the last batch
                    lent.resolve(batch)
                worker, counts = batch.pop(STATS_KEY)
                self._stats_live[int(worker)] = LoaderStats.from_dict(counts)
                self._state = ScheduleState.from_dict(batch.pop(STATE_KEY))
                yield batch
        finally:
            # The workers go now, not when the iterator is collected: a worker's error
            # (a transform returning None) keeps the iterator alive in its traceback,
            # and the workers ignore SIGTERM, so multiprocessing's exit-time join
            # would wait for them forever. Idempotent after a normal end.
            shutdown = getattr(it, "_shutdown_workers", None)
            if shutdown is not None:
                shutdown()

    def __iter__(self) -> Iterator[Sample]:
        return self.batches()

    def identity(self) -> loader_state.LoaderIdentity:
        """What this loader's state is saved with and checked against on restore."""
        return loader_state.LoaderIdentity(
            where=self.where,
            names=self.names,
            digests=tuple(source.manifest.fingerprint() for source in self.sources),
            samples=tuple(source.manifest.samples for source in self.sources),
            seed=self.seed,
            shuffle=self.shuffle,
            shuffle_shards=self.shuffle_shards,
            buckets=tuple(bucket.name for bucket in self.buckets),
            batch_size=self.batch_size,
            mixture=self.mixture,
            allow_changed_data=self.allow_changed_data,
        )

    def state_dict(self) -> dict[str, Any]:
        """Where the schedule stands: equal on every rank, so rank 0's suffices."""
        return loader_state.save(self.identity(), self._state)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the schedule where `state` stopped (saved with any ranks or workers)."""
        self._state = loader_state.restore(self.identity(), state)

    def stats(self) -> LoaderStats:
        """Counters over every batch this loader delivered (all its workers)."""
        total = LoaderStats()
        total.add(self._stats_done)
        for s in self._stats_live.values():
            total.add(s)
        return total

    def _fold_stats(self) -> None:
        for s in self._stats_live.values():
            self._stats_done.add(s)
        self._stats_live.clear()


# SLURM signals every process of a step: SIGUSR2 before the time limit, SIGTERM on
# `scancel`, requeue and preemption. A loader worker (or the fork server the workers
# come from, whose death ends them) killed by one would fail the rank's next batch
# ("DataLoader worker exited unexpectedly") before the rank, which handles them, could
# save. So they ignore both: the rank ends its workers, and KillWait's SIGKILL all.
# (STOP_SIGNALS, in parent_death.py: the fork server's guard blocks them too.)


@contextmanager
def _stop_signals_held(method: str | None) -> Iterator[None]:
    """While the loader starts spawned workers: the stop signals blocked in this thread,
    whose mask a worker keeps through fork and exec, so that one sent to a worker before
    its worker_init_fn waits there (as the fork server's guard does for its workers).
    One sent to the rank meanwhile goes to another of its threads, or to this one when
    they are let through again."""
    if method != "spawn":
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _init_worker(worker_id: int, environment: dict[str, str]) -> None:
    """worker_init_fn: the stop signals ignored, then let through. torch sets its own
    SIGTERM handler in a worker before this runs, which dies of a SIGTERM its parent did
    not send; a worker starts with the stop signals blocked (from the fork server:
    fork_server_guard.py; spawned: `_stop_signals_held`), so one that came meanwhile
    waits, and is discarded here.
    Then: the worker ends with its parent even when that is SIGKILLed
    (stoker/data/stream/parent_death.py), and has the environment the loader was
    started in, not the one the fork server began with (stoker/process/environment.py)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    die_with_parent()
    adopt_environment(environment)


def _start_fork_server_deaf() -> None:
    """Start multiprocessing's fork server (and its resource tracker) with the stop
    signals ignored, which exec keeps and the workers it forks inherit. The rank's own
    handlers are back within the few milliseconds a fork and exec take. Only the main
    thread may change them, and only Python's handlers can be put back; otherwise the
    workers' own SIG_IGN has to do."""
    if threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import forkserver, resource_tracker

    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    if any(handler is None for handler in saved.values()):
        return  # a handler set outside Python: it could not be put back
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        resource_tracker.ensure_running()
        forkserver.ensure_running()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _context(method: str) -> Any:
    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # Workers fork from a server that has imported these once, not each worker. The
        # guard first: the server ends with the rank, even while it imports the others;
        # `ready` last: the garbage collector the guard paused is resumed.
        ctx.set_forkserver_preload(
            [
                "stoker.data.stream.fork_server_guard",
                "torch",
                "numpy",
                "av",
                "stoker.data.stream.worker",
                "stoker.data.stream.fork_server_ready",
            ]
        )
        _start_fork_server_deaf()
    return ctx


def loader_from_config(
    config: Any,
    *,
    rank: int,
    world_size: int,
    micro_batches: int = 1,
    url: str | None = None,
) -> StreamingLoader:
    """The loader an experiment's `data.*` keys describe (`config`: ExperimentConfig):
    data.url (or `url`, the data set a null data.url stands for: the synthetic one), or
    the mixture data.sources. Each global batch (data.batch_size, or each bucket's) is
    split into `micro_batches` (train.grad_accum) loader batches."""
    data = config.data
    url = url or data.url
    if url is None and not data.sources:
        raise StokerError(
            "data.url is null: there is no data set to stream",
            fix="set data.url to a data set (write one with `stoker data synth DST`), or "
            "data.sources to a mixture",
        )
    if data.transform is not None:
        import_transform(data.transform, key="data.transform")  # named as the config names it
    buckets = resolve_buckets(data)
    if not buckets and "latent" in data.modalities:
        # Latents keep the buckets they were encoded with: batched by those, as they are.
        urls = [s.url for s in data.sources] if data.sources else [url]
        buckets = encoded_buckets(urls, data.batch_size)
    if not buckets and data.batch_size % micro_batches:
        raise StokerError(
            f"data.batch_size {data.batch_size} does not split into train.grad_accum="
            f"{micro_batches} micro-batches",
            fix=f"use a data.batch_size that is a multiple of {micro_batches}",
        )
    for i, bucket in enumerate(buckets):
        if bucket.batch_size % micro_batches:
            raise StokerError(
                f"data.buckets[{i}] ({bucket.name}): its batch of {bucket.batch_size} does "
                f"not split into train.grad_accum={micro_batches} micro-batches",
                fix=f"use a batch_size that is a multiple of {micro_batches}",
            )
    buckets = [replace(b, batch_size=b.batch_size // micro_batches) for b in buckets]
    source: str | list[MixSource] = url
    if data.sources:
        source = [MixSource(s.name, s.url, s.weight) for s in data.sources]
    return StreamingLoader(
        source,
        batch_size=data.batch_size // micro_batches,
        rank=rank,
        world_size=world_size,
        num_workers=data.num_workers,
        seed=config.train.seed,
        clip=ClipSpec.from_data(data),
        shuffle_shards=data.shuffle_shards,
        mixing=data.mixing,
        buckets=buckets,
        prefetch_mb=data.prefetch_mb,
        decode_threads=data.decode_threads or None,
        start_method=data.start_method,
        transform=data.transform,
        allow_changed_data=data.allow_changed_data,
        source_name="data.sources" if data.sources else "data.url",
    )
