"""How many cores a process may use and how many ranks share its machine: the one
answer for torch's threads on CPU ranks (stoker/runtime/dist/dist_env.py), the loader's
decode threads (stoker/data/stream/prefetch.py), the planner's tracing processes and
`data pack`'s workers. Standard library only: every layer may import it."""

from __future__ import annotations

import os
from collections.abc import Mapping


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (a SLURM step's cgroup, a
    `taskset`), or the machine's where that is not known (macOS)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def ranks_here(environ: Mapping[str, str] | None = None) -> int:
    """Ranks sharing this machine, by the rules of dist_env's `detect` (its
    local_world_size; a test keeps the two equal, and `detect` also refuses values that
    are not numbers, where this reads them as unset): torchrun's or stoker's variables
    (LOCAL_WORLD_SIZE, else WORLD_SIZE over the nodes), SLURM's tasks over its nodes,
    else 1."""
    environ = os.environ if environ is None else environ
    if "RANK" in environ or "WORLD_SIZE" in environ:
        world = _number(environ, "WORLD_SIZE") or 1
        nodes = _number(environ, "SLURM_NNODES") or _number(environ, "GROUP_WORLD_SIZE")
        per_node = world // nodes if nodes and world % nodes == 0 else world
        local = _number(environ, "LOCAL_WORLD_SIZE") or per_node
        return local if world % local == 0 else world  # uneven nodes: the whole world
    if "SLURM_PROCID" in environ and _number(environ, "SLURM_NTASKS"):
        tasks, nodes = _number(environ, "SLURM_NTASKS"), _number(environ, "SLURM_NNODES") or 1
        return tasks // nodes if tasks % nodes == 0 else tasks
    return 1


def rank_cores(environ: Mapping[str, str] | None = None, ranks: int | None = None) -> int:
    """The cores one rank may use: SLURM's cpus per task, else this process's cores
    shared by the ranks on its machine (`ranks`, or ranks_here)."""
    environ = os.environ if environ is None else environ
    per_task = _number(environ, "SLURM_CPUS_PER_TASK")
    if per_task:
        return per_task
    return max(1, usable_cores() // (ranks or ranks_here(environ)))


def _number(environ: Mapping[str, str], name: str) -> int:
    value = environ.get(name, "")
    return int(value) if value.isdigit() else 0
