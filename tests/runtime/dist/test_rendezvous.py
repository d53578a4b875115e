"""At start, every rank joins or the job fails within the rendezvous timeout naming the
missing ranks and their nodes: real processes, a real TCPStore and gloo."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.protocol import expand_nodelist
from stoker.runtime.dist.dist_env import DistEnv
from stoker.runtime.dist.rendezvous import describe_missing
from tests.mlflow_server import free_port

COLLECTIVE_TIMEOUT_S = 10
JOIN_SCRIPT = f"""
import os, sys, time, torch, torch.distributed as dist
from stoker.errors import StokerError
from stoker.runtime.dist import dist_env, rendezvous
env = dist_env.detect()
started = time.monotonic()
try:
    rendezvous.join(env, torch.device("cpu"), rendezvous_timeout_s=float(sys.argv[1]),
                    collective_timeout_s={COLLECTIVE_TIMEOUT_S})
except StokerError as exc:
    print(f"refused after {{time.monotonic() - started:.1f}} s: {{exc}}", flush=True)
    sys.exit(1)
t = torch.ones(1)
dist.all_reduce(t)
print(f"joined: sum {{t.item():g}}", flush=True)
# A group made after the join (as device meshes' dimensions are), with the
# last rank silent in it, as if frozen: the others' collective ends within the
# collective timeout, not torch's 30 minutes for a new gloo group.
later = dist.new_group(backend="gloo")
done = [f"{{sys.argv[0]}}.done-{{rank}}" for rank in range(env.world_size - 1)]
if env.rank == env.world_size - 1:  # silent until the others are done (or long past)
    until = time.monotonic() + 10 * {COLLECTIVE_TIMEOUT_S}
    while time.monotonic() < until and not all(os.path.exists(d) for d in done):
        time.sleep(0.2)
    os._exit(0)
waited = time.monotonic()
try:
    dist.all_reduce(t, group=later)
    print("the later group's reduce ended without its silent peer", flush=True)
except RuntimeError:
    print(f"the later group timed out after {{time.monotonic() - waited:.1f}} s", flush=True)
open(done[env.rank], "w").close()
os._exit(0)
"""


def _ranks(tmp_path: Path, ranks: list[int], world: int, timeout_s: float) -> list[str]:
    script = tmp_path / "join.py"
    script.write_text(JOIN_SCRIPT)
    port = free_port()
    procs = []
    for rank in ranks:
        env = {
            **os.environ,
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank % 2),
            "SLURM_NNODES": str(world // 2),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "SLURM_JOB_NODELIST": "n[1-2]",
            "OMP_NUM_THREADS": "1",
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(timeout_s)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    # Generous: four Pythons importing torch on a loaded 2-core machine.
    return [proc.communicate(timeout=300)[0] for proc in procs]


def test_all_ranks_join_and_reduce(tmp_path: Path) -> None:
    outputs = _ranks(tmp_path, [0, 1, 2, 3], world=4, timeout_s=240)
    assert all("joined: sum 4" in out for out in outputs), outputs
    waits = [re.search(r"the later group timed out after ([\d.]+) s", out) for out in outputs[:3]]
    assert all(waits), outputs
    # Bounded by the collective timeout (gloo may end a little sooner or later), not
    # by the silent rank's exit (10x).
    assert all(
        0.5 * COLLECTIVE_TIMEOUT_S < float(w[1]) < 3 * COLLECTIVE_TIMEOUT_S for w in waits if w
    )


def test_a_rank_that_never_joins_is_named_with_its_node_within_the_timeout(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    outputs = _ranks(tmp_path, [0, 1, 2], world=4, timeout_s=8)
    for out in outputs:
        assert "rendezvous: 1 of 4 ranks did not join within 8 s" in out, out
        assert "missing rank 3 (node n2)" in out and "train.rendezvous_timeout_s" in out, out
    # Not the collective timeout (60 s here): the rendezvous timeout, plus the start.
    assert time.monotonic() - started < 200


def test_without_rank_0_the_others_say_the_store_never_opened(tmp_path: Path) -> None:
    outputs = _ranks(tmp_path, [1], world=2, timeout_s=6)
    assert "rendezvous: rank 0 did not open the job's store at 127.0.0.1:" in outputs[0]
    assert "stoker logs JOB --rank 0" in outputs[0]


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("gpu-[01-02],cpu7", ["gpu-01", "gpu-02", "cpu7"]),
        ("a[8-10],c", ["a8", "a9", "a10", "c"]),
    ],
)
def test_slurm_host_lists_expand_as_scontrol_does(nodelist: str, names: list[str]) -> None:
    assert expand_nodelist(nodelist) == names


def test_missing_ranks_are_placed_on_their_nodes_by_block() -> None:
    env = DistEnv(0, 6, 0, 3, 0, 2, "torchrun")
    text = describe_missing([2, 4], env, {"SLURM_JOB_NODELIST": "gpu[07-08]"})
    assert text == "rank 2 (node gpu07), rank 4 (node gpu08)"
    assert describe_missing([4], env, {}) == "rank 4"
