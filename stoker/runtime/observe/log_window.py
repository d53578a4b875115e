"""What the trainer adds up between two log steps, and how the ranks' sums combine:

    Window        this rank's sums: steps and their times, the loss and the gradient
                  norm, and what the batches held: rows, stand-ins for skipped samples,
                  model FLOPs and tokens (each batch's own: with data.buckets the shape
                  and the batch size change from batch to batch)
    across_ranks  every rank's row of `GATHERED` numbers into one: the mean of the
                  loss, norm and times, the sum of the counts
    ModelMetrics  the model's own metrics, summed on the device; at a log step averaged
                  over the window and the ranks (the names agreed at the first)

The trainer logs what these give (docs/runtime.md, Metrics and progress).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from stoker.errors import StokerError
from stoker.runtime.dist.dist_env import DistEnv
from stoker.runtime.models.contract import SampleCost
from stoker.runtime.observe.step_watch import StepTimes

LOADER_COUNTERS = ("short_samples", "fetch_retries", "failed_shards")
"""The loader's counters (LoaderStats) logged as `system/data/<name>`, per log window."""
GATHERED = (
    "loss_sum",
    "grad_norm_max",
    "data_s",
    "forward_s",
    "rows",
    "skipped_samples",
    "flops",
    "tokens",
    *LOADER_COUNTERS,
)
"""What each rank sends at a log step, in this order (one all-gather)."""
_MEANS = ("loss_sum", "grad_norm_max", "data_s", "forward_s")


@dataclass
class Window:
    """What accumulates between two log steps, on the device where it can."""

    steps: int = 0
    loss_sum: torch.Tensor | None = None
    grad_norm_max: torch.Tensor | None = None
    data_s: float = 0.0
    forward_s: float = 0.0  # the blocks' forward without waits for other ranks (ForwardClock)
    fwd_bwd_s: float = 0.0
    optim_s: float = 0.0
    skipped_steps: int = 0
    rows: int = 0
    """This rank's samples, stand-ins for skipped ones included (the work done)."""
    skipped_samples: int = 0
    """Samples the loader could not use in these batches (their rows: stand-ins)."""
    flops: float = 0.0
    """Model FLOPs of the rows, each batch at its shape's FLOPs per sample; 0: unknown."""
    tokens: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def add_batch(self, rows: int, skipped: int, cost: SampleCost) -> None:
        """A micro-batch this rank trained on: `rows` samples (stand-ins included), and
        `skipped` samples the loader could not use."""
        self.rows += rows
        self.skipped_samples += skipped
        self.flops += rows * (cost.flops or 0.0)
        self.tokens += rows * (cost.tokens or 0)

    def add_step(self, times: StepTimes) -> None:
        """Any finished step, skipped or not: this rank's times."""
        self.steps += 1
        self.data_s += times.data_s
        self.forward_s += times.forward_s
        self.fwd_bwd_s += times.fwd_bwd_s
        self.optim_s += times.optim_s

    def add_good_step(self, loss_sum: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """A step the optimizer took: its loss into the sum, its norm into the max."""
        self.loss_sum = loss_sum if self.loss_sum is None else self.loss_sum + loss_sum
        norm = grad_norm.detach().float()
        self.grad_norm_max = (
            norm if self.grad_norm_max is None else torch.maximum(self.grad_norm_max, norm)
        )

    def gathered(self, device: torch.device, loader_counts: list[float]) -> torch.Tensor:
        """This rank's `GATHERED` numbers, fp32 on `device` (no host sync: the loss and
        the norm stay where they are). `loader_counts`: LOADER_COUNTERS' increments."""
        zero = torch.zeros((), device=device)
        on_device = torch.stack(
            [
                self.loss_sum if self.loss_sum is not None else zero,
                self.grad_norm_max if self.grad_norm_max is not None else zero,
            ]
        ).float()
        steps = max(self.steps, 1)
        host = [self.data_s / steps, self.forward_s / steps, float(self.rows)]
        host += [float(self.skipped_samples), self.flops, self.tokens, *loader_counts]
        # fp64 on the host, then fp32: FLOPs of a window (1e15 and more) keep 7 digits.
        return torch.cat([on_device, torch.tensor(host, dtype=torch.float64).to(device).float()])


def across_ranks(rows: list[list[float]]) -> dict[str, float]:
    """Every rank's `GATHERED` row into one: the mean over ranks of the loss sum, the
    gradient norm and the times; the sum of the counts (rows, FLOPs, skipped samples)."""
    combined: dict[str, float] = {}
    for index, name in enumerate(GATHERED):
        total = sum(row[index] for row in rows)
        combined[name] = total / len(rows) if name in _MEANS else total
    return combined


def column(rows: list[list[float]], name: str) -> list[float]:
    """One `GATHERED` number of every rank, by rank."""
    index = GATHERED.index(name)
    return [row[index] for row in rows]


class ModelMetrics:
    """The model's own metrics (forward's `(loss, {name: value})`), summed on the
    device over the micro-batches of a log window."""

    def __init__(self, env: DistEnv, device: torch.device, model_name: str) -> None:
        self.env, self.device, self.model_name = env, device, model_name
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._names: list[str] | None = None  # agreed by the ranks at the first log

    def add(self, metrics: dict[str, Any]) -> None:
        """A micro-batch's metrics."""
        if not metrics:
            return
        self._count += 1
        for name, value in metrics.items():
            value = torch.as_tensor(value, device=self.device).detach().float()
            previous = self._sums.get(name)
            self._sums[name] = value if previous is None else previous + value

    def reduce(self) -> dict[str, float]:
        """The window's means, averaged over ranks (one all-reduce, only for a model
        that returns metrics); the sums start again."""
        names = sorted(self._sums)
        if self._names is None:
            self._names = self._agreed(names)
        if not names:
            return {}
        values = torch.stack([self._sums[n] for n in names]) / self._count
        if self.env.distributed:
            torch.distributed.all_reduce(values)
            values = values / self.env.world_size
        self._sums, self._count = {}, 0
        return dict(zip(names, values.tolist(), strict=True))

    def _agreed(self, names: list[str]) -> list[str]:
        """At the first log: every rank returns the same metric names, or the all-reduce
        would mix them up or wait forever; a model that does not is told so."""
        if not self.env.distributed:
            return names
        every: list[Any] = [None] * self.env.world_size
        torch.distributed.all_gather_object(every, names)
        for rank, theirs in enumerate(every):
            if theirs != names:
                raise StokerError(
                    f"{self.model_name}.forward returned metrics {theirs} on rank "
                    f"{rank} but {names} on rank {self.env.rank}",
                    fix="return the same metric names on every rank and every batch "
                    "(a metric with no value for a batch: return 0 or NaN for it)",
                )
        return names
