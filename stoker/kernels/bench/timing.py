"""Timing a GPU function: CUDA events around each call, L2 flushed before it,
warm-up first, the median of the repeats. On the CPU (the harness's own tests)
the same loop with perf_counter."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

# Larger than any current L2 (H100 50 MB, H200 60 MB, B200 126 MB): a call
# after the flush reads its inputs from HBM, as inside a training step where
# the previous layer's 100+ MB have passed through.
_FLUSH_BYTES = 256 << 20


class Timer:
    """Median milliseconds of `fn()` on one device."""

    def __init__(self, device: torch.device, *, warmup: int = 5, reps: int = 30) -> None:
        self.device, self.warmup, self.reps = device, warmup, reps
        self._cuda = device.type == "cuda"
        self._flush = (
            torch.empty(_FLUSH_BYTES, dtype=torch.int8, device=device) if self._cuda else None
        )

    def median_ms(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        if not self._cuda:
            samples = []
            for _ in range(self.reps):
                began = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - began) * 1e3)
            return statistics.median(samples)
        assert self._flush is not None
        events = [(_event(), _event()) for _ in range(self.reps)]
        torch.cuda.synchronize(self.device)
        for start, end in events:
            self._flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return float(statistics.median(start.elapsed_time(end) for start, end in events))


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def copy_bandwidth_gbps(timer: Timer, nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth, read + write bytes per second (GB/s):
    the roofline every kernel row is set against. 1 GiB by default."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=timer.device)
    dst = torch.empty_like(src)
    ms = timer.median_ms(lambda: dst.copy_(src))
    return 2 * nbytes / (ms * 1e-3) / 1e9
