"""Run fetches ahead of the decoder in threads, bounded by bytes.

The decoder consumes samples in stream order; the prefetcher keeps fetches in
flight for the samples after it until their expected bytes reach the budget.
A bound by count alone would hold 10x more memory for 4K clips than for 64x64
ones; a bound by bytes alone has small clips queue by the thousand (256 MB of
40 KB clips: ~6,500 fetches at every loader start, 2-3 CPU-seconds per rank and
worker before the first batch, while only `threads` of them run at a time). So
both: the budget's bytes, and at most `AHEAD_PER_THREAD` samples per thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from stoker.process.cores import rank_cores

T = TypeVar("T")
R = TypeVar("R")

# Decode threads a worker takes at most, however many cores are spare: PyAV's and
# swscale's calls release the GIL, the rest of a decode holds it (2 threads gave 1.55
# cores of work on the 2-core VM).
MAX_DECODE_THREADS = 4

# Queued samples per fetch thread, however small: enough to ride out a slow fetch
# (the others keep the decoder fed), few enough that a loader starts at once.
AHEAD_PER_THREAD = 16


class Prefetcher(Generic[T, R]):
    """Yields (item, result, error, waited_s) in the order of `items`."""

    def __init__(
        self,
        fetch: Callable[[T], R],
        items: Iterator[T],
        *,
        estimate_bytes: Callable[[T], int],
        budget_bytes: int,
        threads: int = 4,
    ) -> None:
        self._fetch = fetch
        self._items = items
        self._estimate = estimate_bytes
        self._budget = max(1, budget_bytes)
        self._max_queued = AHEAD_PER_THREAD * max(1, threads)
        self._pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="prefetch")
        self._queue: deque[tuple[T, Future[R], int]] = deque()
        self._queued_bytes = 0
        self._exhausted = False

    def _fill(self) -> None:
        # Always at least one in flight, however large one sample is.
        while not self._exhausted and (
            not self._queue
            or (self._queued_bytes < self._budget and len(self._queue) < self._max_queued)
        ):
            try:
                item = next(self._items)
            except StopIteration:
                self._exhausted = True
                return
            size = self._estimate(item)
            self._queue.append((item, self._pool.submit(self._fetch, item), size))
            self._queued_bytes += size

    def __iter__(self) -> Iterator[tuple[T, R | None, BaseException | None, float]]:
        try:
            while True:
                self._fill()
                if not self._queue:
                    return
                item, future, size = self._queue.popleft()
                self._queued_bytes -= size
                start = time.perf_counter()
                try:
                    result, error = future.result(), None
                except Exception as exc:  # handed to the caller, who counts and skips
                    result, error = None, exc
                waited = time.perf_counter() - start
                self._fill()  # refill before the caller decodes: overlap
                yield item, result, error, waited
        finally:
            self.close()

    def close(self) -> None:
        for _, future, _ in self._queue:
            future.cancel()
        self._queue.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)


def map_ahead(
    items: Iterator[T], function: Callable[[T], R], threads: int
) -> Generator[tuple[T, R], None, None]:
    """(item, function(item)) in the order of `items`, `function` running in a pool of
    `threads` on the items after the one the caller holds (so `threads` + 1 results at
    most are alive at once). threads <= 1: called inline, as a plain loop. An exception
    from `function` is raised to the caller at its item; when the caller stops (or on
    that exception) the pool is shut down and `items` closed.

    The loader's workers decode this way when the machine has more cores than workers:
    PyAV and swscale release the GIL, so one worker decodes on two cores (1.5x the
    samples/s of one thread on the 2-core VM, 5% more CPU a sample). The bound is by
    count: a decoded 5 s 720p clip at 8 fps is ~110 MB."""
    pool = (
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="decode")
        if threads > 1
        else None
    )
    queue: deque[tuple[T, Future[R]]] = deque()
    try:
        for item in items:
            if pool is None:
                yield item, function(item)
                continue
            queue.append((item, pool.submit(function, item)))
            while len(queue) > threads:
                ready, future = queue.popleft()
                yield ready, future.result()
        while queue:
            ready, future = queue.popleft()
            yield ready, future.result()
    finally:
        for _, future in queue:
            future.cancel()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        close = getattr(items, "close", None)
        if close is not None:
            close()  # a generator's own finally (the Prefetcher's pool) runs now


def auto_decode_threads(workers: int, environ: Mapping[str, str] | None = None) -> int:
    """Decode threads per loader worker when none are asked for (data.decode_threads 0):
    the rank's cores (stoker/process/cores.py: SLURM's cpus per task, or the cores this process
    may run on shared by the ranks on its machine) over its workers, at most
    MAX_DECODE_THREADS. 1 without workers: the training process then decodes, and its
    cores are the step's."""
    if workers < 1:
        return 1
    return max(1, min(MAX_DECODE_THREADS, rank_cores(environ) // workers))
