"""The loader a training loop holds: a DataLoader over the global sample stream,
with a resumable state.

    loader = StreamingLoader("s3://bucket/av", batch_size=32, rank=rank, world_size=world)
    loader.load_state_dict(checkpoint["loader"])      # after a restart, any world size
    for step, batch in zip(range(steps), loader):
        ...                                            # batch["video"]: B/R x T x 3 x H x W uint8
        checkpoint["loader"] = loader.state_dict()

The state is a position in the global stream, counted in the main process from
the batches the loop has taken, never from what workers prefetched. Resuming
with other numbers of ranks or workers continues the same stream: nothing
repeated, nothing skipped.
"""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from typing import Any

from stoker.data.dataset import DataSource, open_dataset
from stoker.data.decode import array_fields
from stoker.data.fetch import RetryPolicy
from stoker.data.loader_stats import LoaderStats
from stoker.data.parent_death import die_with_parent
from stoker.data.shard_format import MODALITIES
from stoker.data.stream import (
    STATS_KEY,
    ClipSpec,
    Sample,
    StreamDataset,
    StreamPlan,
    Transform,
    import_transform,
)
from stoker.errors import StokerError

STATE_VERSION = 1
START_METHODS = ("forkserver", "spawn")


class StreamingLoader:
    """Batches of this rank's slice of the global stream, resumable and elastic."""

    def __init__(
        self,
        data: str | DataSource,
        *,
        batch_size: int,
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
        clip_offset: str = "random",
        shuffle: bool = True,
        shuffle_shards: int = 4,
        prefetch_mb: float = 256,
        fetch_threads: int = 4,
        retry: RetryPolicy | None = None,
        start_method: str = "forkserver",
        storage_options: dict[str, Any] | None = None,
        transform: Transform | str | None = None,
        pin_memory: bool = False,
        source_name: str = "StreamingLoader",
    ) -> None:
        self.source = data if isinstance(data, DataSource) else open_dataset(data, storage_options)
        where = f"{source_name} of {self.source.url}"
        if world_size < 1 or not 0 <= rank < world_size:
            raise StokerError(f"{where}: rank {rank} is not in a world of size {world_size}")
        if batch_size < world_size or batch_size % world_size:
            raise StokerError(
                f"{where}: global batch size {batch_size} does not split over {world_size} ranks",
                fix=f"use a multiple of {world_size} (each rank takes batch_size / ranks)",
            )
        unknown = [m for m in modalities if m not in MODALITIES]
        if unknown or not modalities:
            raise StokerError(
                f"{where}: unknown modalities {unknown or list(modalities)}",
                fix=f"choose from {', '.join(MODALITIES)}",
            )
        missing = [m for m in modalities if m not in self.source.manifest.modalities]
        if missing:
            raise StokerError(
                f"{where}: asks for {', '.join(missing)}, which not every sample of the data set "
                f"has (it has: {', '.join(self.source.manifest.modalities) or 'nothing'})",
                fix="drop those from the loader's modalities, or pack a data set that has them",
            )
        if clip_offset not in ("random", "start"):
            raise StokerError(
                f"{where}: clip_offset {clip_offset!r} is not one of random, start",
                fix="use clip_offset random (training) or start (evaluation)",
            )
        if start_method not in START_METHODS:
            raise StokerError(
                f"{where}: worker start method {start_method!r} is not one of "
                f"{', '.join(START_METHODS)}",
                fix="fork is refused: fsspec's async filesystems (s3fs, gcsfs) are not fork-safe",
            )
        protocol = self.source.fs.protocol
        if num_workers and ("memory" in (protocol if isinstance(protocol, tuple) else (protocol,))):
            raise StokerError(
                f"{where}: memory:// lives in one process; DataLoader workers would see it empty",
                fix="use num_workers=0 with memory://",
            )
        if isinstance(transform, str):
            # Here, before any worker starts: each worker imports it again by name.
            import_transform(transform)
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.shuffle_shards = shuffle_shards
        self.clip = ClipSpec(
            modalities=tuple(modalities),
            fps=fps,
            size=size,
            clip_seconds=clip_seconds,
            sample_rate=sample_rate,
            channels=channels,
            clip_offset=clip_offset,
            arrays=array_fields(self.source.manifest.fields),
        )
        self.prefetch_bytes = int(prefetch_mb * (1 << 20))
        self.fetch_threads = fetch_threads
        self.retry = retry or RetryPolicy()
        self.start_method = start_method
        self.transform = transform
        self.pin_memory = pin_memory
        self.position = 0
        """Global stream position of the next batch's first sample."""
        self._stats_done = LoaderStats()
        self._stats_live: dict[int, LoaderStats] = {}

    @property
    def samples_per_epoch(self) -> int:
        return self.source.manifest.samples

    @property
    def epoch(self) -> int:
        return self.position // self.samples_per_epoch

    def batches(self, max_batches: int | None = None) -> Iterator[Sample]:
        """This rank's next batches, from the current position on (endless by default)."""
        from torch.utils.data import DataLoader

        self._fold_stats()
        dataset = StreamDataset(
            source=self.source,
            plan=StreamPlan(
                batch_size=self.batch_size,
                rank=self.rank,
                world_size=self.world_size,
                start=self.position,
                seed=self.seed,
                max_batches=max_batches,
                shuffle=self.shuffle,
                shuffle_shards=self.shuffle_shards,
            ),
            clip=self.clip,
            transform=self.transform,
            prefetch_bytes=self.prefetch_bytes,
            fetch_threads=self.fetch_threads,
            retry=self.retry,
        )
        workers = self.num_workers
        loader = DataLoader(
            dataset,
            batch_size=None,  # the dataset yields whole per-rank batches
            num_workers=workers,
            multiprocessing_context=_context(self.start_method) if workers else None,
            prefetch_factor=2 if workers else None,
            persistent_workers=False,
            pin_memory=self.pin_memory,
            worker_init_fn=_init_worker if workers else None,
        )
        it = iter(loader)
        try:
            for batch in it:
                worker, counts = batch.pop(STATS_KEY)
                self._stats_live[int(worker)] = LoaderStats.from_dict(counts)
                self.position += self.batch_size
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

    def state_dict(self) -> dict[str, Any]:
        """Where the global stream stands: equal on every rank, so rank 0's suffices."""
        epoch, within = divmod(self.position, self.samples_per_epoch)
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "samples_consumed": within,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_shards": self.shuffle_shards,
            "dataset": self.source.manifest.fingerprint(),
            "dataset_samples": self.samples_per_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream where `state` stopped (saved with any ranks or workers)."""
        where = f"loader state for {self.source.url}"
        try:
            version = int(state["version"])
            epoch = int(state["epoch"])
            consumed = int(state["samples_consumed"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StokerError(
                f"{where}: not a StreamingLoader state ({exc!r} missing or bad)",
                fix="pass what StreamingLoader.state_dict() returned",
            ) from exc
        if version > STATE_VERSION:
            raise StokerError(f"{where}: state version {version} is newer than this stoker")
        fingerprint = self.source.manifest.fingerprint()
        if state.get("dataset") != fingerprint:
            raise StokerError(
                f"{where}: the state was saved on another data set (fingerprint "
                f"{state.get('dataset')}, this one {fingerprint}): its positions mean "
                "other samples",
                fix="resume on the data set the run started with, or start the loader afresh",
            )
        for key in ("seed", "shuffle", "shuffle_shards"):
            if key in state and state[key] != getattr(self, key):
                raise StokerError(
                    f"{where}: the state was saved with {key}={state[key]!r}, this loader "
                    f"has {key}={getattr(self, key)!r}: the order would differ",
                    fix=f"construct the loader with {key}={state[key]!r}",
                )
        if not 0 <= consumed < self.samples_per_epoch or epoch < 0:
            raise StokerError(f"{where}: position epoch={epoch} samples={consumed} is out of range")
        self.position = epoch * self.samples_per_epoch + consumed

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
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR2)


def _init_worker(worker_id: int) -> None:
    """worker_init_fn: the stop signals ignored (for workers that did not inherit the
    fork server's SIG_IGN), and the worker ends with its parent even when that is
    SIGKILLed (stoker/data/parent_death.py)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    die_with_parent()


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
        # guard first: the server ends with the rank, even while it imports the others.
        ctx.set_forkserver_preload(
            ["stoker.data.fork_server_guard", "torch", "numpy", "av", "stoker.data.stream"]
        )
        _start_fork_server_deaf()
    return ctx


def loader_from_config(config: Any, *, rank: int, world_size: int) -> StreamingLoader:
    """The loader an experiment's `data.*` keys describe (`config`: ExperimentConfig)."""
    data = config.data
    if data.url is None:
        raise StokerError(
            "data.url is null: there is no data set to stream",
            fix="set data.url to a data set (write one with `stoker data synth DST`)",
        )
    if data.transform is not None:
        import_transform(data.transform, key="data.transform")  # named as the config names it
    return StreamingLoader(
        data.url,
        batch_size=data.batch_size,
        rank=rank,
        world_size=world_size,
        num_workers=data.num_workers,
        seed=config.train.seed,
        modalities=tuple(data.modalities),
        fps=data.fps,
        size=tuple(data.resolution),
        clip_seconds=data.clip_seconds,
        sample_rate=data.sample_rate,
        channels=data.channels,
        clip_offset=data.clip_offset,
        shuffle_shards=data.shuffle_shards,
        prefetch_mb=data.prefetch_mb,
        start_method=data.start_method,
        transform=data.transform,
        source_name="data.url",
    )
