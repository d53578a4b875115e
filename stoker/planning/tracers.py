"""Who runs a plan's traces: this process, or a pool of processes (one per core, at
most MAX_WORKERS) when a candidate needs several (one per bucket). A trace is pure
Python dispatch on fake tensors, one core each: two buckets traced at once on two
cores take the time of one. The workers start while the model's facts are traced
here, and each keeps its FakeTensorMode cache across the traces it runs."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from stoker.errors import StokerError
from stoker.planning import trace
from stoker.planning.trace import Traced, TraceSpec
from stoker.process.cores import usable_cores
from stoker.process.gc_pause import pause_collector, resume_collector

MAX_WORKERS = 4
_WORKER_CFG: list[Any] = []


def _start_worker(cfg_json: dict[str, Any]) -> None:
    pause_collector()  # while the worker imports (stoker/process/gc_pause.py)
    try:
        from stoker.config import ExperimentConfig

        _WORKER_CFG[:] = [ExperimentConfig.model_validate(cfg_json)]
        # What every trace imports, imported while the parent traces the model's facts.
        import torch.distributed._tools.fsdp2_mem_tracker  # noqa: F401

        import stoker.runtime.models  # noqa: F401
    finally:
        resume_collector()


def _trace_in_worker(spec: TraceSpec) -> Traced | tuple[str, str]:
    """The trace, or (message, fix) of the error it raised: stoker's errors take keyword
    arguments, which an exception crossing a process boundary loses."""
    try:
        return trace.trace_step(_WORKER_CFG[0], spec)
    except Exception as exc:  # re-raised in the parent, with its message
        message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
        return str(message), str(getattr(exc, "fix", None) or "")


def _ready() -> bool:
    return True


WORKERS_ENV = "STOKER_PLAN_WORKERS"
"""Caps the processes (1: trace in this one), e.g. to compare in benchmarks/plan.py."""


def worker_count(buckets: int) -> int:
    """Processes worth starting: one per bucket, no more than the cores we may use."""
    cap = os.environ.get(WORKERS_ENV, "").strip()
    if cap.isdigit() and int(cap) >= 1:
        buckets = min(buckets, int(cap))
    return max(1, min(buckets, usable_cores(), MAX_WORKERS))


@contextmanager
def tracer_for(cfg: Any, buckets: int) -> Iterator[tuple[Any, int]]:
    """A tracer (search.Tracer) for `cfg` and how many traces it runs at once: in this
    process for one bucket or one core, else over a pool of spawned workers (spawn: no
    fork of a process holding torch threads and a process group)."""
    workers = worker_count(buckets)
    if workers == 1:

        def here(specs: list[TraceSpec]) -> list[Traced]:
            return [trace.trace_step(cfg, spec) for spec in specs]

        try:
            yield here, 1
        finally:
            trace.close()
        return
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(cfg.model_dump(mode="json"),),
    )
    try:
        for _ in range(workers):  # start them all now
            pool.submit(_ready)

        def pooled(specs: list[TraceSpec]) -> list[Traced]:
            out = []
            for got in pool.map(_trace_in_worker, specs):
                if not isinstance(got, Traced):
                    raise StokerError(f"tracing a candidate failed: {got[0]}", fix=got[1] or None)
                out.append(got)
            return out

        yield pooled, workers
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
