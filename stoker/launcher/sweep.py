"""Sweep axes: `optim.lr=1e-4,3e-4 train.seed=1,2` → one override set per job-array task."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from stoker.errors import StokerError

MAX_TASKS = 10_000  # far below SLURM's MaxArraySize on any cluster we know; a typo guard


@dataclass(frozen=True)
class SweepPlan:
    fixed: list[str]  # overrides every task shares
    axes: dict[str, list[str]]  # key -> values, in the order given
    tasks: list[dict[str, str]]  # one {key: value} per array task, last axis fastest

    def overrides(self, index: int) -> list[str]:
        return [*self.fixed, *(f"{k}={v}" for k, v in self.tasks[index].items())]


def _split_values(text: str) -> list[str]:
    """`1e-4,3e-4` → two values; a YAML list or mapping (`[1,2]`) stays one value."""
    if text.startswith(("[", "{")):
        return [text]
    return text.split(",")


def plan_sweep(args: Sequence[str]) -> SweepPlan:
    fixed: list[str] = []
    axes: dict[str, list[str]] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise StokerError(
                f"sweep argument {arg!r} is not KEY=V1,V2,...",
                fix="e.g. `stoker sweep exp.yaml optim.lr=1e-4,3e-4 train.seed=1,2`",
            )
        values = _split_values(value)
        if len(values) == 1:
            fixed.append(arg)
            continue
        if "" in values:
            raise StokerError(
                f"sweep axis {arg!r} has an empty value", fix="remove the stray comma"
            )
        if key in axes:
            raise StokerError(f"sweep axis {key} is given twice", fix="give each key once")
        axes[key] = values
    if not axes:
        raise StokerError(
            "no sweep axis: give at least one KEY=V1,V2 with two or more values",
            fix="e.g. `stoker sweep exp.yaml optim.lr=1e-4,3e-4`; for one job use `stoker submit`",
        )
    combos = list(itertools.product(*axes.values()))
    if len(combos) > MAX_TASKS:
        raise StokerError(
            f"the sweep has {len(combos)} tasks, more than {MAX_TASKS}",
            fix="sweep fewer values per key",
        )
    tasks = [dict(zip(axes, combo, strict=True)) for combo in combos]
    return SweepPlan(fixed, axes, tasks)
