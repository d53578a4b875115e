"""Threads for torch on CPU ranks (stoker/runtime/dist/dist_env.py cpu_threads). The suite
runs every process with OMP_NUM_THREADS=1 (scripts/test-suite), so the choice a user's
job makes without it is checked here, with the environment given explicitly."""

from __future__ import annotations

import os

from stoker.runtime.dist.dist_env import DistEnv, cpu_threads


def _ranks_on_node(local_world_size: int) -> DistEnv:
    return DistEnv(rank=0, world_size=local_world_size, local_rank=0,
                   local_world_size=local_world_size, node_rank=0, num_nodes=1,
                   source="torchrun")  # fmt: skip


def test_without_a_setting_the_ranks_on_a_node_share_its_usable_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert cpu_threads(_ranks_on_node(1), {}) == cores
    assert cpu_threads(_ranks_on_node(2), {}) == max(1, cores // 2)
    assert cpu_threads(_ranks_on_node(4 * cores), {}) == 1  # never zero


def test_omp_num_threads_then_slurm_cpus_per_task_decide() -> None:
    two = _ranks_on_node(2)
    assert cpu_threads(two, {"OMP_NUM_THREADS": "3", "SLURM_CPUS_PER_TASK": "5"}) == 3
    assert cpu_threads(two, {"SLURM_CPUS_PER_TASK": "5"}) == 5
    # Not a positive count: ignored, as torch would refuse it.
    assert cpu_threads(_ranks_on_node(1), {"OMP_NUM_THREADS": "0", "SLURM_CPUS_PER_TASK": "x"}) == (
        len(os.sched_getaffinity(0))
    )
