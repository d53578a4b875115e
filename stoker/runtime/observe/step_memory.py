"""What a run's steps measured, per batch shape (data.buckets: one per bucket): peak
memory and step time, kept by global rank 0 in `<run>/measured-steps.json` for
`stoker plan --calibrate RUN` to hold against the plan (docs/plan.md).

- On a GPU, every step: the CUDA allocator's peak (`max_memory_allocated`, reset before
  each step), its reserved peak, and what the device had in use at the step's end
  (`mem_get_info`: with the CUDA context and NCCL's buffers, which the allocator does
  not see). Host-side counters: no synchronisation.
- On a CPU there is no allocator to ask: with `train.measure_memory`, the second step
  of each shape runs under PyTorch's FSDP memory tracker (the first makes AdamW's
  states), which counts every tensor the rank holds; it slows that one step.
- The step time is the wall time from the first forward to zero_grad, without the data
  wait; the median over the shape's steps after its first, the traced one left out.

The file is rewritten atomically at every log step, so a run killed later keeps it.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from stoker.atomic_write import write_text_atomic
from stoker.checkpoint.commit import MEASURED_NAME
from stoker.modes import ResolvedPrecision
from stoker.runtime.models.contract import shape_key

MEASURED_FILE = MEASURED_NAME  # the same name in the run folder and in each checkpoint
_KEEP_TIMES = 200  # the newest step times per shape


def shape_name(batch: Mapping[str, Any]) -> str:
    """A batch's per-sample shapes as one string: what plan and run both key by."""
    return ";".join(f"{name}{list(shape)}" for name, shape in shape_key(batch) if shape)


class StepMemory:
    """Rank 0's measurements of its steps, by batch shape."""

    def __init__(
        self, run_dir: Path, device: torch.device, *, enabled: bool, trace_cpu: bool, ema_bytes: int
    ) -> None:
        self.path = run_dir / MEASURED_FILE
        self.device = device
        self.enabled = enabled
        self.trace_cpu = trace_cpu and device.type == "cpu"
        self.ema_bytes = ema_bytes
        self.shapes: dict[str, dict[str, Any]] = {}
        self._times: dict[str, list[float]] = {}

    @contextmanager
    def measure(
        self, micro: Sequence[Mapping[str, Any]], model: Any, optimizer: Any
    ) -> Iterator[None]:
        if not self.enabled or not micro:
            yield
            return
        name = shape_name(micro[0])
        seen = self._times.setdefault(name, [])
        entry = self.shapes.setdefault(
            name, {"micro_batch": _rows(micro[0]), "micro_batches": len(micro)}
        )
        trace = self.trace_cpu and len(seen) == 1 and "peak_bytes" not in entry
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        began = time.perf_counter()
        with tracked(model, optimizer, micro) if trace else _nothing() as peak:
            yield
        took = time.perf_counter() - began
        if not trace:  # the tracker slows its step several times over: not a step time
            seen.append(took)
            del seen[:-_KEEP_TIMES]
        if trace:
            snapshot = peak()
            entry["peak_bytes"] = int(snapshot["Total"]) + self.ema_bytes
            entry["peak_source"] = "memory tracker"
        elif self.device.type == "cuda":
            allocated = torch.cuda.max_memory_allocated(self.device)
            if allocated > entry.get("peak_bytes", 0):
                free, total = torch.cuda.mem_get_info(self.device)
                entry.update(
                    peak_bytes=int(allocated),
                    peak_source="cuda allocator",
                    reserved_bytes=int(torch.cuda.max_memory_reserved(self.device)),
                    device_used_bytes=int(total - free),
                )
        if len(seen) > 1:  # the first step of a shape compiles and warms up
            entry["step_s"] = statistics.median(seen[1:])
            entry["steps"] = len(seen)

    def write(self, world_size: int, precision: ResolvedPrecision) -> None:
        if not self.enabled or not self.shapes:
            return
        device = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else "cpu"
        doc = {
            "format": 1,
            "device": device,
            "world_size": world_size,
            "precision": precision,
            "shapes": self.shapes,
        }
        write_text_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def read_measured(run_dir: Path) -> dict[str, Any] | None:
    """The run's measurements, or None when it wrote none (or an unreadable file)."""
    try:
        return parse_measured((run_dir / MEASURED_FILE).read_text())
    except OSError:
        return None


def parse_measured(text: str) -> dict[str, Any] | None:
    """A measured-steps.json document (a run folder's, or the one a checkpoint carries),
    or None for text that is not one."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == 1 else None


@contextmanager
def tracked(model: Any, optimizer: Any, inputs: Iterable[Any]) -> Iterator[Callable[[], Any]]:
    """PyTorch's memory tracker (its FSDP one for an FSDP2 model) around a step of several
    micro-batches: its per-module stats are cleared before each forward after the first
    (it refuses a second call of the root otherwise), its global peak kept. Yields a
    function giving the peak snapshot ({reference type: bytes, "Total": bytes})."""
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker: MemTracker
    if _fsdp(model):
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs(tuple(inputs))
    else:
        tracker = MemTracker()
        tracker.track_external(model, optimizer, *_tensors(inputs))
    _global_peak_only(tracker)
    calls = [0]

    def again(module: Any, _args: Any) -> None:
        if module is model:
            if calls[0]:
                tracker.reset_mod_stats()
            calls[0] += 1

    # Registered before the tracker's own global hooks: this one runs first.
    handle = torch.nn.modules.module.register_module_forward_pre_hook(again)
    try:
        with tracker:
            yield lambda: next(iter(tracker.get_tracker_snapshot("peak").values()))
    finally:
        handle.remove()


def _global_peak_only(tracker: Any) -> None:
    """Keep only the tracker's global peak, the one `tracked` reads. At every op PyTorch's
    tracker also walks every module it has seen for their own peaks, copying a snapshot
    at each new one: a cost per op that grows with the model's depth (a 40-block model's
    plan spent most of its time there), for figures nothing here reads. Left as it is
    where the tracker's internals are not the ones this was written against."""
    update = getattr(tracker, "_update_peak_stats", None)
    if not (callable(update) and isinstance(getattr(tracker, "_peak_mem", None), dict)):
        return

    def global_peak(_state: Any) -> None:
        for device, snapshot in tracker._curr_mem_snap.items():
            if tracker._peak_mem.get(device, 0) < snapshot["Total"]:
                tracker._peak_mem[device] = snapshot["Total"]
                tracker._peak_mem_snap[device] = dict(snapshot)

    tracker._update_peak_stats = global_peak


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds of `tensors` (a DTensor's local shard)."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        total += int(local.numel() * local.element_size())
    return total


def _tensors(inputs: Iterable[Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in inputs:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, Mapping):
            found += _tensors(value.values())
        elif isinstance(value, (list, tuple)):
            found += _tensors(value)
    return found


def _fsdp(model: Any) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _rows(batch: Mapping[str, Any]) -> int:
    for value in batch.values():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 0


@contextmanager
def _nothing() -> Iterator[Callable[[], Any]]:
    yield dict
