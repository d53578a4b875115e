"""The loader's prefetcher (stoker/data/stream/prefetch.py) bounds what it queues by bytes and by
count: small clips must not queue by the thousand at every loader start, large ones must
not pass the byte budget. Its decode-ahead (map_ahead) keeps the stream's order, holds
few decoded clips, and takes the cores its machine can spare."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from stoker.data.stream.prefetch import (
    AHEAD_PER_THREAD,
    MAX_DECODE_THREADS,
    Prefetcher,
    auto_decode_threads,
    map_ahead,
)


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


def test_map_ahead_keeps_the_order_and_holds_threads_plus_one_results() -> None:
    """Results in the items' order whatever order the threads finish in, and no more
    than `threads` + 1 alive at once (the one the caller holds and those decoding): a
    decoded 720p clip is ~100 MB."""
    import threading
    import time

    alive = 0
    most = 0
    lock = threading.Lock()

    def work(item: int) -> int:
        nonlocal alive, most
        with lock:
            alive += 1
            most = max(most, alive)
        time.sleep(0.002 * (item % 3))  # later items finish first now and then
        return item * 10

    out = []
    for item, result in map_ahead(iter(range(40)), work, threads=3):
        out.append((item, result))
        with lock:
            alive -= 1  # the caller is done with this result
    assert out == [(i, i * 10) for i in range(40)]
    assert most == 4


def _decode_threads() -> set[object]:
    """The decode pools' threads alive now (a loader of an earlier test in this process,
    not yet collected, may still hold some: compare with those before)."""
    import threading

    return {t for t in threading.enumerate() if t.name.startswith("decode")}


def test_map_ahead_raises_at_the_failing_item_and_stops_its_threads() -> None:
    def work(item: int) -> int:
        if item == 5:
            raise ValueError("bad item 5")
        return item

    seen = []
    before = _decode_threads()
    with pytest.raises(ValueError, match="bad item 5"):
        for item, _ in map_ahead(iter(range(100)), work, threads=2):
            assert _decode_threads() - before, "no decode thread is running"
            seen.append(item)
    assert seen == [0, 1, 2, 3, 4]
    assert _decode_threads() - before == set()  # the pool is shut down, not left running


def test_a_caller_that_stops_early_shuts_the_pool_and_closes_the_items() -> None:
    closed = []

    def items() -> Iterator[int]:
        try:
            yield from range(1000)
        finally:
            closed.append(True)  # the Prefetcher's generator shuts its fetch pool here

    before = _decode_threads()
    stream = map_ahead(items(), lambda item: item, threads=3)
    assert next(stream) == (0, 0)
    stream.close()
    assert closed == [True] and _decode_threads() - before == set()


def test_map_ahead_with_one_thread_calls_inline() -> None:
    import threading

    main = threading.get_ident()
    threads = [t for _, t in map_ahead(iter(range(3)), lambda _: threading.get_ident(), 1)]
    assert threads == [main] * 3


def test_decode_threads_share_the_cores_among_ranks_and_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: set(range(16)))
    assert auto_decode_threads(1, {}) == MAX_DECODE_THREADS  # 16 cores, capped
    assert auto_decode_threads(4, {}) == 4
    assert auto_decode_threads(8, {}) == 2
    assert auto_decode_threads(0, {}) == 1  # the training process decodes: no threads
    torchrun = {"RANK": "0", "WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}
    assert auto_decode_threads(2, torchrun) == 1
    assert (
        auto_decode_threads(1, {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_NNODES": "2"}) == 4
    )
    assert (
        auto_decode_threads(2, {"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_NNODES": "2"})
        == 1
    )
    assert auto_decode_threads(2, {"SLURM_CPUS_PER_TASK": "12"}) == 4  # SLURM's word first
    assert auto_decode_threads(3, {"SLURM_CPUS_PER_TASK": "6", "WORLD_SIZE": "8"}) == 2
    # stoker's local launch inside an allocation of one task: its 8 ranks share the cores.
    local = {"RANK": "0", "WORLD_SIZE": "8", "SLURM_NTASKS": "1", "SLURM_NNODES": "1"}
    assert auto_decode_threads(1, local) == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda _: {0, 1})
    assert auto_decode_threads(1, {}) == 2  # the 2-core VM at one worker
    assert auto_decode_threads(2, {}) == 1
    assert auto_decode_threads(1, {"RANK": "1", "WORLD_SIZE": "2"}) == 1
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS: the machine's cores
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert auto_decode_threads(2, {}) == 4
