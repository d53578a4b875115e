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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

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
