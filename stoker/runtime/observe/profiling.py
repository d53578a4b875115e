"""`train.profile_steps: [first, last]`: a torch.profiler trace of those steps.

Each rank writes, into <run folder>/profile/:
    trace-rank<R>.json          Chrome trace (chrome://tracing, Perfetto)
    key-averages-rank<R>.txt    the operators by self time, as a table
and global rank 0's are logged to MLflow under `profile/`. The phases of a
step (data, forward, backward, optimizer) are named ranges in the trace and,
on CUDA, NVTX ranges for Nsight Systems. Outside the profiled steps the phases
cost nothing (no range is opened).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch


class StepProfiler:
    def __init__(
        self,
        steps: tuple[int, int] | None,
        run_dir: Path,
        rank: int,
        device: torch.device,
    ) -> None:
        self.steps, self.rank, self.device = steps, rank, device
        self.folder = run_dir / "profile"
        self._profile: Any = None
        self._written: list[Path] = []

    @property
    def active(self) -> bool:
        return self._profile is not None

    def before_step(self, step: int) -> None:
        """`step` (1-based) is about to run: start at the first profiled step."""
        if self.steps is not None and step == self.steps[0] and self._profile is None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities, record_shapes=True)
            self._profile.__enter__()

    def after_step(self, step: int) -> None:
        """`step` has finished: stop and write after the last profiled one."""
        if self._profile is not None and self.steps is not None and step >= self.steps[1]:
            self._finish()

    def phase(self, name: str) -> AbstractContextManager[Any]:
        """A named range around a phase of the step, while profiling."""
        if self._profile is None:
            return nullcontext()
        return self._range(f"stoker/{name}")

    @contextmanager
    def _range(self, name: str) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.nvtx.range_push(name)  # type: ignore[no-untyped-call]
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            if cuda:
                torch.cuda.nvtx.range_pop()  # type: ignore[no-untyped-call]

    def _finish(self) -> None:
        profile, self._profile = self._profile, None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        profile.__exit__(None, None, None)
        self.folder.mkdir(parents=True, exist_ok=True)
        trace = self.folder / f"trace-rank{self.rank}.json"
        profile.export_chrome_trace(str(trace))
        sort = "self_cuda_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = self.folder / f"key-averages-rank{self.rank}.txt"
        table.write_text(profile.key_averages().table(sort_by=sort, row_limit=60) + "\n")
        self._written += [trace, table]

    def close(self) -> list[Path]:
        """Finish a profile the run ended inside; the files written."""
        if self._profile is not None:
            self._finish()
        return self._written
