"""The device mesh with context parallelism (train.context_parallel: N): which ranks
split a sample's tokens, which shard the weights, and how each CP group's batches reach
its ranks.

CP groups: a mesh (data, ring, ulysses), innermost last, so a CP group is N consecutive
ranks (placed node by node: Ulysses within a node, a ring across when N spans nodes).
FSDP2 shards the weights over every rank of a replica, the CP ranks included
(torchtitan's dp_shard_cp): CP costs no extra weight memory, and FSDP's mean over those
ranks is what turns the CP ranks' summed gradients back into CP 1's
(models/context_parallel.py).
With train.sharding "node" and several nodes, a replica is one node, or the nodes one
CP group spans (HSDP across them); with "all", one replica over the whole world.

Data parallelism is over the CP groups: data rank = rank // N of world / N. Each CP
group reads and decodes a batch once, on its CP rank 0, which broadcasts it to the
others (`group_batches`); every CP rank then cuts its share of the tokens in forward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from stoker.mesh_layout import mesh_shape
from stoker.modes import Sharding
from stoker.runtime.dist.dist_env import DistEnv, data_parallel_mesh
from stoker.runtime.models.context_parallel import GroupContextParallel


@dataclass(frozen=True)
class TrainingMesh:
    """What a rank trains over: the mesh FSDP2 shards on (None for one process), its
    context parallelism (None without), and its place among the data-parallel groups."""

    fsdp: DeviceMesh | None
    cp: GroupContextParallel | None
    data_rank: int
    data_world: int


def training_mesh(
    env: DistEnv,
    device: torch.device,
    sharding: Sharding = "node",
    cp: int = 1,
    ulysses: int | None = None,
) -> TrainingMesh:
    """The mesh for `env` (module doc); without CP, dist_env's data-parallel mesh."""
    if cp == 1:
        return TrainingMesh(data_parallel_mesh(env, device, sharding), None, env.rank, env.world_size)
    ulysses = ulysses or cp
    replicate, shard = mesh_shape(
        env.world_size, env.local_world_size, env.num_nodes, sharding, cp
    )
    from torch.distributed.device_mesh import init_device_mesh

    cp_mesh = init_device_mesh(
        device.type,
        (replicate * shard, cp // ulysses, ulysses),
        mesh_dim_names=("data", "ring", "ulysses"),
    )
    context = GroupContextParallel(
        cp_mesh["ring", "ulysses"]._flatten("cp").get_group(),
        cp_mesh["ulysses"].get_group() if ulysses > 1 else None,
        cp_mesh["ring"].get_group() if cp > ulysses else None,
    )
    # FSDP's own mesh over the same ranks, as without CP but with each shard group
    # holding its CP groups whole (consecutive ranks).
    fsdp = (
        init_device_mesh(
            device.type, (replicate, shard * cp), mesh_dim_names=("replicate", "shard")
        )
        if replicate > 1
        else init_device_mesh(device.type, (env.world_size,), mesh_dim_names=("shard",))
    )
    return TrainingMesh(fsdp, context, env.rank // cp, env.world_size // cp)


def data_share(env: DistEnv, cp: GroupContextParallel | None) -> tuple[int, int]:
    """(data-parallel rank, data-parallel groups): (rank, world) without CP."""
    shares = cp.size if cp is not None else 1
    return env.rank // shares, env.world_size // shares


# A log window's counts of what a batch holds (observe/log_window.py), which each rank
# of a CP group counts for the same batch.
PER_BATCH = ("rows", "tokens", "flops", "skipped_samples")


def once_per_group(total: dict[str, float], cp: GroupContextParallel | None) -> dict[str, float]:
    """The window's totals over the ranks with each CP group's batches counted once."""
    if cp is not None:
        total = {k: v / cp.size if k in PER_BATCH else v for k, v in total.items()}
    return total


def group_batches(source: Iterator[Any] | None, cp: GroupContextParallel) -> Iterator[Any]:
    """The CP group's batches on every rank of it: CP rank 0 reads them from `source`
    (the loader) and broadcasts each, pickled, to the others (whose `source` is None).
    A batch is what the loader gives on the host, before it moves to the device."""
    first = dist.get_global_rank(cp.group, 0)
    while True:
        box: list[Any] = [next(source) if source is not None else None]
        dist.broadcast_object_list(box, src=first, group=cp.group)
        yield box[0]


def group_state(state: Any, cp: GroupContextParallel | None) -> Any:
    """The loader's state as the CP group's rank 0 has it, on every rank of the group (a
    collective; `state` itself without CP). Only CP rank 0 reads batches, so only its
    loader has moved on; a checkpoint takes the loader state of whichever rank DCP picks
    (it saves a replicated object once), which must be that one."""
    if cp is None:
        return state
    box = [state]
    dist.broadcast_object_list(box, src=dist.get_global_rank(cp.group, 0), group=cp.group)
    return box[0]
