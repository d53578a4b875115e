"""Where a rank stands, from the launcher's, torchrun's or SLURM's variables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stoker.process.cores import ranks_here
from stoker.errors import StokerError
from stoker.runtime.dist.dist_env import DistEnv, detect, lost_peer


def test_one_process_without_variables() -> None:
    assert detect({}) == DistEnv(0, 1, 0, 1, 0, 1, "single")


def test_stoker_launcher_variables_on_two_nodes() -> None:
    # What base.sbatch.j2 exports for task 3 of --nodes 2 --ntasks-per-node 2.
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1",
           "SLURM_NNODES": "2", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}  # fmt: skip
    got = detect(env)
    assert got == DistEnv(3, 4, 1, 2, 1, 2, "torchrun")
    assert not got.is_main and not got.is_node_main and got.distributed


def test_torchrun_variables() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
           "GROUP_RANK": "1"}  # fmt: skip
    assert detect(env) == DistEnv(5, 8, 1, 4, 1, 2, "torchrun")


def test_slurm_variables_alone() -> None:
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
           "SLURM_NODEID": "1", "SLURM_NNODES": "2"}  # fmt: skip
    assert detect(env) == DistEnv(2, 4, 0, 2, 1, 2, "slurm")


def test_uneven_nodes_shard_over_the_whole_world() -> None:
    env = {"RANK": "1", "WORLD_SIZE": "3", "LOCAL_RANK": "1", "SLURM_NNODES": "2"}
    got = detect(env)
    assert (got.local_world_size, got.num_nodes) == (3, 1)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 is outside a world of 4"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK='x' is not an integer"),
        ({"RANK": "0"}, "WORLD_SIZE is not set"),
    ],
)
def test_bad_variables_are_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(StokerError, match=message):
        detect(env)


PEER_SCRIPT = """
import datetime, os, sys, time, torch, torch.distributed as dist
from stoker.runtime.dist.dist_env import lost_peer
rank, how = int(sys.argv[1]), sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=3))
dist.all_reduce(torch.ones(1))
if rank == 1:
    if how == "killed":
        os._exit(9)
    time.sleep(30)  # frozen: never joins the next collective
try:
    dist.all_reduce(torch.ones(1))
except Exception as exc:
    print("lost_peer", lost_peer(exc), type(exc).__name__, flush=True)
    os._exit(0)
"""


@pytest.mark.parametrize("how", ["frozen", "killed"])
def test_a_collective_that_lost_its_peer_is_told_from_a_bug(tmp_path: Path, how: str) -> None:
    """Real gloo: a peer that stops answering (timeout) or dies (closed connection)."""
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", PEER_SCRIPT, str(r), str(store), how],
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]  # fmt: skip
    out = procs[0].communicate(timeout=60)[0]
    procs[1].kill()
    procs[1].wait()
    assert out.startswith("lost_peer True"), out
    assert not lost_peer(ValueError("bad batch shape"))
    assert not lost_peer(RuntimeError("CUDA error: an illegal memory access"))
    try:
        try:
            raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer")
        except RuntimeError as cause:
            raise StokerError("saving step-10 failed") from cause
    except StokerError as chained:
        assert lost_peer(chained)


def test_train_sharding_chooses_hsdp_or_fsdp_over_every_node() -> None:
    """train.sharding=node (the default) on two nodes of two ranks: a (replicate 2,
    shard 2) mesh; all: one shard dimension of 4. On a fake process group of 4."""
    code = (
        "import torch, torch.distributed as dist\n"
        "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
        "from stoker.runtime.dist.dist_env import DistEnv, data_parallel_mesh\n"
        "dist.init_process_group('fake', store=FakeStore(), rank=0, world_size=4)\n"
        "env = DistEnv(0, 4, 0, 2, 0, 2, 'torchrun')\n"
        "cpu = torch.device('cpu')\n"
        "node, every = data_parallel_mesh(env, cpu), data_parallel_mesh(env, cpu, 'all')\n"
        "print(node.mesh_dim_names, tuple(node.shape), every.mesh_dim_names, tuple(every.shape))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout  # fmt: skip
    assert out.split("\n")[0] == "('replicate', 'shard') (2, 2) ('shard',) (4,)"


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"RANK": "3", "WORLD_SIZE": "8"},
        {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
        {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "3"},  # uneven: the world
        {"RANK": "3", "WORLD_SIZE": "8", "SLURM_NNODES": "2"},
        {"RANK": "3", "WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "4"},
        {"RANK": "3", "WORLD_SIZE": "9", "SLURM_NNODES": "2"},
        {"SLURM_PROCID": "5", "SLURM_NTASKS": "16", "SLURM_NNODES": "2"},
        {"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_NNODES": "2"},
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"},
    ],
)
def test_the_ranks_sharing_a_machine_are_counted_as_the_runtime_counts_them(
    environ: dict[str, str],
) -> None:
    """stoker/process/cores.py counts them for the layers below the runtime (the loader's decode
    threads); it must agree with the runtime's own count."""
    assert ranks_here(environ) == detect(environ).local_world_size
