"""The job flags as one type: `--nodes` .. `--name` of `stoker submit` and `stoker
sweep`, the same keyword arguments of the Python API (`stoker.submit(nodes=2)`), and
the SLURM options of the data array jobs (`stoker data pack --slurm --time 2:00:00`).
Each sets the `job.*` key of its name, with the precedence of a flag (docs/config.md),
and each source spells it as its user wrote it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class JobFlags:
    """None: not given (the experiment, the profile or the default decides)."""

    nodes: int | None = None
    ntasks_per_node: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    time: str | None = None
    partition: str | None = None
    name: str | None = None

    def for_config(self, spelled: Callable[[str], str]) -> dict[str, tuple[Any, str]]:
        """As `resolve_config` takes them: `job.<name>` -> (value or None, where it came
        from: `spelled(name)`, e.g. `--nodes` or `nodes=`)."""
        return {f"job.{f.name}": (getattr(self, f.name), spelled(f.name)) for f in fields(self)}

    def given(self, spelled: Callable[[str], str]) -> dict[str, Any]:
        """The flags given, by their spelling: {"--time": "2:00:00"}."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {spelled(name): value for name, value in values if value is not None}


def command_line(name: str) -> str:
    """`ntasks_per_node` as the command line spells it: `--ntasks-per-node`."""
    return "--" + name.replace("_", "-")


def keyword(name: str) -> str:
    """As the Python API spells it: `ntasks_per_node=`."""
    return f"{name}="


JOB_FLAG_NAMES = tuple(f.name for f in fields(JobFlags))
