"""Where this process stands in the job: rank, world, node, device, backend,
and the device mesh that data parallelism shards over.

Read from, first match wins:
    torchrun's / stoker's variables  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
                                     NODE_RANK (the stoker batch script and `submit
                                     --local` export the torchrun set from SLURM's)
    SLURM's own                      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID,
                                     SLURM_NNODES (srun without stoker's wrapper)
    nothing                          one process
MASTER_ADDR / MASTER_PORT come from the launcher (or torchrun); a single
process needs none.

Mesh: ranks on one node shard the model between them (FSDP2 over fast links);
with several nodes, each node holds a replica and gradients are all-reduced
across nodes (HSDP), so the slow inter-node network carries one all-reduce per
step instead of the all-gathers of every layer.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch
from torch.distributed.device_mesh import DeviceMesh

from stoker.modes import Sharding
from stoker.process.cores import rank_cores
from stoker.errors import StokerError

Source = Literal["torchrun", "slurm", "single"]


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    source: Source

    @property
    def is_main(self) -> bool:
        """Global rank 0: the one that logs, writes progress and prints."""
        return self.rank == 0

    @property
    def is_node_main(self) -> bool:
        return self.local_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def node_name() -> str:
    """This rank's node as SLURM names it (several slurmd may share a host), else the host."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise StokerError(f"the environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError as exc:
        raise StokerError(
            f"the environment variable {name}={raw!r} is not an integer",
            fix=f"unset {name} or set it to this process's {name.lower()}",
        ) from exc


def _per_node(world: int, nodes: int) -> int:
    """Ranks per node; the whole world when nodes are unknown or uneven."""
    return world // nodes if nodes and world % nodes == 0 else world


def detect(env: Mapping[str, str] | None = None) -> DistEnv:
    """The DistEnv the environment describes; an error names a variable that
    is missing or out of range."""
    env = os.environ if env is None else env
    if "RANK" in env or "WORLD_SIZE" in env:
        source: Source = "torchrun"
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", 0)
        nodes = _int(env, "SLURM_NNODES", 0) or _int(env, "GROUP_WORLD_SIZE", 0)
        local_world = _int(env, "LOCAL_WORLD_SIZE", 0) or _per_node(world, nodes)
        node_rank = _int(env, "NODE_RANK", 0) or _int(env, "GROUP_RANK", rank // local_world)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        source = "slurm"
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local_rank = _int(env, "SLURM_LOCALID", 0)
        nodes = _int(env, "SLURM_NNODES", 1)
        local_world = _per_node(world, nodes)
        node_rank = _int(env, "SLURM_NODEID", rank // local_world)
    else:
        return DistEnv(0, 1, 0, 1, 0, 1, "single")
    if world < 1 or not 0 <= rank < world:
        raise StokerError(f"rank {rank} is outside a world of {world} processes ({source})")
    if local_world < 1 or world % local_world:
        # Uneven nodes (srun --distribution): shard over the whole world instead.
        local_world = world
    num_nodes = world // local_world
    if not 0 <= local_rank < local_world:
        local_rank = rank % local_world
    return DistEnv(rank, world, local_rank, local_world, node_rank % num_nodes, num_nodes, source)


def device_for(env: DistEnv) -> torch.device:
    """This rank's GPU (local rank, modulo the GPUs it can see: SLURM may bind
    one GPU per task), or the CPU."""
    if torch.cuda.is_available():
        index = env.local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def cpu_threads(env: DistEnv, environ: Mapping[str, str] | None = None) -> int:
    """Threads for torch on CPU ranks: SLURM's cpus per task, or this
    machine's usable cores shared by the ranks on it. torch's default (every
    core in every rank) oversubscribes: 2 ranks x 2 threads on 2 cores ran
    10x slower per step than 1 thread each (measured on the development VM)."""
    environ = os.environ if environ is None else environ
    value = environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    return rank_cores(environ, ranks=env.local_world_size)


def all_gather_flat(output: torch.Tensor, tensor: torch.Tensor) -> None:
    """Every rank's `tensor` into consecutive slices of the flat `output` (gloo refuses
    a (ranks, n) output): all_gather_single since torch 2.13, all_gather_into_tensor
    before (deprecated since)."""
    gather = getattr(torch.distributed, "all_gather_single", None)
    if gather is None:
        gather = torch.distributed.all_gather_into_tensor
    gather(output, tensor)


def data_parallel_mesh(
    env: DistEnv, device: torch.device, sharding: Sharding = "node"
) -> DeviceMesh | None:
    """("shard",) over all ranks on one node, or with `sharding` "all" (train.sharding)
    over all ranks of every node; ("replicate", "shard") = (nodes, ranks per node)
    across nodes (HSDP). None for one process."""
    if not env.distributed:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    if env.num_nodes > 1 and sharding == "node":
        return init_device_mesh(
            device.type,
            (env.num_nodes, env.local_world_size),
            mesh_dim_names=("replicate", "shard"),
        )
    return init_device_mesh(device.type, (env.world_size,), mesh_dim_names=("shard",))


# What a collective raises when a peer went away, rather than for this rank's own bug:
# gloo's timeouts and closed connections (plain RuntimeErrors), and torch's DistError
# family (NCCL's watchdog, the rendezvous store).
_PEER_LOSS = re.compile(
    r"Timed out waiting|Connection (closed|reset) by peer|ECONNRESET|Broken pipe|"
    r"communicator was aborted|Watchdog caught collective operation timeout",
    re.IGNORECASE,
)


def lost_peer(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is a collective that lost a peer."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, torch.distributed.DistError):
            return True
        if isinstance(current, RuntimeError) and _PEER_LOSS.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False
