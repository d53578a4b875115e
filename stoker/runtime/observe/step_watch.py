"""What watches each training step without changing it, behind one object:

    heartbeat   the step and phase this rank is in, for the hang watchdog
                (stoker/runtime/observe/heartbeat.py; off when train.hang_timeout_s is 0)
    profiler    the torch.profiler window of train.profile_steps and a named
                range per phase (stoker/runtime/observe/profiling.py)
    timing      this rank's own time per step: data wait, forward + backward up to
                the flags sync, optimizer, and the blocks' forward without waits for
                other ranks (`ForwardClock`, stoker/runtime/observe/stragglers.py)

The loop calls, per step:

    watch.begin(step)                      profiler window, clocks start
    with watch.phase("data"): ...          heartbeat + profiler range
    watch.lap("data")                      end of the data wait
    watch.beat(COLLECTIVE_PHASE)           heartbeat only (no range)
    times = watch.end(step)                the step's StepTimes
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stoker.config import TrainConfig
from stoker.protocol import ENV_RESTART
from stoker.runtime.observe.heartbeat import Heartbeat
from stoker.runtime.observe.profiling import StepProfiler
from stoker.runtime.observe.stragglers import ForwardClock


@dataclass(frozen=True)
class StepTimes:
    """One step's seconds on this rank."""

    data_s: float  # taking the step's micro-batches from the loader
    forward_s: float  # the blocks' forward without waits for other ranks (ForwardClock)
    fwd_bwd_s: float  # forward, backward, clipping and the flags sync
    optim_s: float  # optimizer and schedule step, zeroing the gradients


class StepWatch:
    def __init__(
        self,
        train: TrainConfig,
        run_dir: Path,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        blocks: Iterable[nn.Module],
    ) -> None:
        self.profiler = StepProfiler(train.profile_steps, run_dir, rank, device)
        self.heartbeat: Heartbeat | None = None
        if train.hang_timeout_s:
            self.heartbeat = Heartbeat(
                run_dir,
                rank=rank,
                world_size=world_size,
                restart=int(os.environ.get(ENV_RESTART) or 0),
                timeout_s=train.hang_timeout_s,
            )
            self.heartbeat.start()
        self.forward_clock = ForwardClock(blocks, device)
        self.step = 0  # the step (1-based) being run
        self._laps: dict[str, float] = {}

    def begin(self, step: int) -> None:
        """`step` (1-based) starts: the profiler's window opens at its first step."""
        self.step = step
        self.profiler.before_step(step)
        self._laps = {"start": time.perf_counter()}
        self.forward_clock.reset()

    def phase(self, name: str) -> AbstractContextManager[Any]:
        """Around a phase of the step: the heartbeat's phase, a profiler range."""
        self.beat(name)
        return self.profiler.phase(name)

    def beat(self, name: str) -> None:
        """The heartbeat only: the rank is in phase `name` of this step."""
        if self.heartbeat is not None:
            self.heartbeat.beat(self.step, name)

    def lap(self, name: str) -> None:
        """The step has reached the end of `name` ("data", then "fwd_bwd")."""
        self._laps[name] = time.perf_counter()

    def end(self, step: int) -> StepTimes:
        """`step` has finished (after the flags sync: the forward clock's CUDA events
        have completed, reading them waits for nothing)."""
        now = time.perf_counter()
        laps = self._laps
        times = StepTimes(
            data_s=laps["data"] - laps["start"],
            forward_s=self.forward_clock.take(),
            fwd_bwd_s=laps["fwd_bwd"] - laps["data"],
            optim_s=now - laps["fwd_bwd"],
        )
        self.profiler.after_step(step)
        return times

    def close(self) -> list[Path]:
        """Remove the hooks, stop the heartbeat, finish a profile the run ended
        inside; the profile files this rank wrote."""
        self.forward_clock.remove()
        if self.heartbeat is not None:
            self.heartbeat.stop()
        return self.profiler.close()
