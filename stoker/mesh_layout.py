"""The shape of a job's device mesh with context parallelism: how many replicas, and how
many ranks shard the weights beside each CP group. One rule for both sides: the launcher
checks it before anything is queued (stoker/launcher/launch/checks.py), the runtime builds
its mesh from it (stoker/runtime/dist/context_mesh.py)."""

from __future__ import annotations

from stoker.errors import StokerError


def mesh_shape(world: int, per_node: int, nodes: int, sharding: str, cp: int) -> tuple[int, int]:
    """(replicas, shard) for `world` ranks, `per_node` on each of `nodes`, in CP groups of
    `cp` consecutive ranks: one replica over everything with train.sharding "all" or one
    node; else one per node, or per the nodes one CP group spans (HSDP across them). A
    StokerError naming the fix when the groups do not fit."""
    if world % cp:
        raise StokerError(
            f"train.context_parallel={cp} does not divide the job's {world} ranks",
            fix="use a divisor of job.nodes x job.ntasks_per_node for train.context_parallel",
        )
    if nodes == 1 or sharding == "all":
        return 1, world // cp
    span = max(per_node, cp)  # one node, or the nodes one CP group spans
    if span % per_node or span % cp:
        raise StokerError(
            f"train.context_parallel={cp} neither divides a node's {per_node} ranks nor "
            "spans whole nodes",
            fix=f"use a divisor or a multiple of {per_node} (job.ntasks_per_node)",
        )
    return world // span, span // cp
