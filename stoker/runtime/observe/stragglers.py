"""Stragglers: which rank holds the others up, and whether its loader or its node is slow.

Every rank waits for the slowest at each collective, so a rank's wall time per step
is the slowest rank's and cannot tell who is slow. Nor can its time until the step's
flags all-reduce: FSDP2 all-gathers every block's parameters in forward and
reduce-scatters its gradients in backward, so a fast rank spends the straggler's extra
time waiting inside forward and backward. (Measured on 2 CPU ranks, tiny model: with
rank 1 sleeping 0.4 s a step in its data loader, rank 0 took longer than rank 1 to
reach the flags all-reduce.) What is a rank's own is the time it spends where no other
rank is involved:

    data wait        taking the step's batches from its loader (host time)
    forward compute  each block's forward, from after FSDP has waited for the
                     block's all-gather to the block's end (`ForwardClock`)

Their sum per step is the rank's *own time*. Backward runs the same kernels on the
same device, so a slow GPU or node shows in forward already; leaving backward out
avoids FSDP's reduce-scatter waits, which sit among its autograd hooks. The trainer
gathers each rank's mean data wait and forward compute over the log window to every
rank (in the window's one all-gather), and `Slowest.of` names the slowest rank, its
node and its ratio to the median; `stoker status` flags it above STRAGGLER_RATIO
(stoker/launcher/watch/status.py).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from stoker import metric_names as names


class ForwardClock:
    """Seconds this rank spent in the forward of its blocks, without the waits for other
    ranks: a forward pre-hook registered after FSDP2's (which waits for the block's
    all-gather) starts the clock, a forward hook that runs before FSDP2's stops it.

    On the CPU that is host time. On a GPU the host only queues kernels, so CUDA events
    time it on the stream: the start event completes once the stream has waited for the
    all-gather, the stop event once the block's kernels have run. `take()` reads them
    after the step's flags sync, which has completed them: no extra sync. Activation
    checkpointing's recompute in backward calls the wrapped block, not these hooks.
    """

    def __init__(self, blocks: Iterable[nn.Module], device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._spare: list[Any] = []  # CUDA events to reuse
        self._pending: list[tuple[Any, Any]] = []  # this step's (start, stop) events
        self._started: Any = None
        self._seconds = 0.0
        self._handles: list[RemovableHandle] = []
        for block in blocks:
            self._handles.append(block.register_forward_pre_hook(self._start))
            self._handles.append(block.register_forward_hook(self._stop, prepend=True))

    def _start(self, module: nn.Module, args: Any) -> None:
        if self._cuda:
            self._started = self._spare.pop() if self._spare else _timing_event()
            self._started.record()
        else:
            self._started = time.perf_counter()

    def _stop(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._started is None:
            return
        if self._cuda:
            stop = self._spare.pop() if self._spare else _timing_event()
            stop.record()
            self._pending.append((self._started, stop))
        else:
            self._seconds += time.perf_counter() - self._started
        self._started = None

    def reset(self) -> None:
        """Forget what was timed since the last take (an evaluation's forwards)."""
        for pair in self._pending:
            self._spare.extend(pair)
        self._pending.clear()
        self._started, self._seconds = None, 0.0

    def take(self) -> float:
        """The forward compute since the last reset or take; call after the step's sync."""
        seconds = self._seconds
        for start, stop in self._pending:
            seconds += float(start.elapsed_time(stop)) / 1e3
        self.reset()
        return seconds

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def _timing_event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class Slowest:
    """The rank with the longest own time per step (data wait + forward compute) over
    one log window; seconds are means per step."""

    rank: int
    host: str
    step_s: float  # its own time
    median_step_s: float  # the median rank's (the mean of the middle two for an even world)
    min_step_s: float
    data_wait_s: float  # its data wait: the loader's part of step_s
    median_data_wait_s: float

    @classmethod
    def of(
        cls, data_wait_s: Sequence[float], forward_s: Sequence[float], hosts: Sequence[str]
    ) -> Slowest:
        """From per-rank values, index = rank."""
        own = [data + forward for data, forward in zip(data_wait_s, forward_s, strict=True)]
        rank = max(range(len(own)), key=lambda r: own[r])
        return cls(
            rank=rank,
            host=hosts[rank],
            step_s=own[rank],
            median_step_s=statistics.median(own),
            min_step_s=min(own),
            data_wait_s=data_wait_s[rank],
            median_data_wait_s=statistics.median(data_wait_s),
        )

    @property
    def ratio(self) -> float:
        """step_s / median_step_s; 1.0 when the median is 0 (nothing to compare)."""
        return self.step_s / self.median_step_s if self.median_step_s > 0 else 1.0

    def metrics(self) -> dict[str, float]:
        return {
            names.STRAGGLER_STEP_S_MIN: self.min_step_s,
            names.STRAGGLER_STEP_S_MEDIAN: self.median_step_s,
            names.STRAGGLER_STEP_S_MAX: self.step_s,
            names.STRAGGLER_RANK: float(self.rank),
            names.STRAGGLER_RATIO: self.ratio,
            names.STRAGGLER_DATA_WAIT_S: self.data_wait_s,
            names.STRAGGLER_DATA_WAIT_S_MEDIAN: self.median_data_wait_s,
        }
