"""The loader's prefetcher (stoker/data/stream/prefetch.py) bounds what it queues by bytes and by
count: small clips must not queue by the thousand at every loader start, large ones must
not pass the byte budget."""

from __future__ import annotations

from collections.abc import Iterator

from stoker.data.stream.prefetch import AHEAD_PER_THREAD, Prefetcher


def _pulled(size: int, budget: int, threads: int) -> int:
    """How many items the prefetcher has taken from its source when it hands out the
    first: that one, and the queue it refilled behind it."""
    taken = 0

    def source() -> Iterator[int]:
        nonlocal taken
        for item in range(100_000):
            taken += 1
            yield item

    prefetcher = Prefetcher(lambda item: item, source(), estimate_bytes=lambda _: size,
                            budget_bytes=budget, threads=threads)  # fmt: skip
    stream = iter(prefetcher)
    item, result, error, _ = next(stream)
    assert (item, result, error) == (0, 0, None)
    prefetcher.close()
    return taken


def test_small_samples_queue_at_most_a_few_per_thread() -> None:
    # 256 MB of 40 KB clips would be ~6,500 in flight.
    assert _pulled(40_000, 256 << 20, threads=4) == 1 + 4 * AHEAD_PER_THREAD
    assert _pulled(40_000, 256 << 20, threads=1) == 1 + AHEAD_PER_THREAD


def test_large_samples_stop_at_the_byte_budget_and_one_is_always_in_flight() -> None:
    assert _pulled(10 << 20, 30 << 20, threads=4) == 1 + 3
    assert _pulled(100 << 20, 30 << 20, threads=4) == 1 + 1
