"""Smoke tests of the SLURM cluster the launcher tests run against (tests/cluster)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.launcher.slurm.query import TERMINAL_STATES
from tests.launcher_jobs import wait_final

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm

LOCALSLURM = Path(__file__).parent / "localslurm.py"
FINAL_STATES = TERMINAL_STATES  # the states after which a job has ended for good


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def submit(cluster: ClusterSettings, folder: Path, script: str, *options: str) -> str:
    """sbatch a bash script; output goes to folder/job-<id>.out. Returns the job id."""
    path = folder / "job.sh"
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + script)
    result = run(
        "sbatch",
        "--parsable",
        f"--partition={cluster.partition}",
        f"--chdir={folder}",
        f"--output={folder}/job-%j.out",
        "--time=2",
        *options,
        str(path),
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().split(";")[0]  # "id" or "id;cluster"


def accounted_state(job_id: str, timeout: float = 30) -> str:
    """The job's final state in the accounting database (it lags slurmctld a little)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = run("sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State").stdout.strip()
        if state.split(" ")[0] in FINAL_STATES:  # e.g. "CANCELLED by 0"
            return state
        time.sleep(0.3)
    pytest.fail(f"sacct shows job {job_id} as {state!r} after {timeout} s")


def test_cluster_is_healthy(slurm_cluster: ClusterSettings) -> None:
    if slurm_cluster.external:
        assert run("sinfo", "-h").returncode == 0
        return
    result = run(sys.executable, str(LOCALSLURM), "status", "--state-dir", slurm_cluster.state_dir)
    assert result.returncode == 0, result.stdout + result.stderr
    for node in slurm_cluster.node_names:
        assert f"up: node {node} " in result.stdout, result.stdout


def test_two_node_job_runs_one_task_per_node(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    job_id = submit(
        slurm_cluster,
        tmp_path,
        "srun --ntasks-per-node=1 bash -c 'echo \"task $SLURM_PROCID on $SLURMD_NODENAME\"'\n",
        "--nodes=2",
        "--ntasks-per-node=1",
    )
    assert wait_final(job_id, timeout=60) == "COMPLETED"
    lines = (tmp_path / f"job-{job_id}.out").read_text().split("\n")
    nodes = sorted(line.split(" on ")[1] for line in lines if line.startswith("task "))
    assert len(nodes) == 2 and len(set(nodes)) == 2, lines
    assert set(nodes) <= set(slurm_cluster.node_names)
    assert accounted_state(job_id) == "COMPLETED"


def test_nodes_advertise_gpus(slurm_cluster: ClusterSettings) -> None:
    result = run("sinfo", "-N", "-h", "-p", slurm_cluster.partition, "-o", "%N %G")
    assert result.returncode == 0, result.stderr
    gres = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert set(gres) == set(slurm_cluster.node_names)
    if not slurm_cluster.external:
        assert gres == {"n1": "gpu:4", "n2": "gpu:4", "n3": "gpu:4"}


def test_job_gets_the_gpus_it_asked_for(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    if not slurm_cluster.external:
        # The local cluster always has fake GPUs: never skip there.
        assert slurm_cluster.gpus_per_node == 4
    elif slurm_cluster.gpus_per_node < 2:
        # Only a real cluster's CPU partition (STOKER_TEST_SLURM_EXTERNAL=1) lacks them.
        pytest.skip(f"external partition {slurm_cluster.partition} has < 2 GPUs per node")
    job_id = submit(
        slurm_cluster,
        tmp_path,
        'echo "gpus_on_node=${SLURM_GPUS_ON_NODE:-}"\n'
        'echo "cuda_visible=${CUDA_VISIBLE_DEVICES:-}"\n',
        "--nodes=1",
        "--gpus-per-node=2",
    )
    assert wait_final(job_id, timeout=60) == "COMPLETED"
    output = (tmp_path / f"job-{job_id}.out").read_text()
    assert "gpus_on_node=2\n" in output
    if slurm_cluster.gpus_are_devices:
        visible = output.split("cuda_visible=")[1].split("\n")[0]
        assert len(visible.split(",")) == 2, output


def test_more_gpus_than_a_node_has_is_refused(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    too_many = slurm_cluster.gpus_per_node + 1
    result = run(
        "sbatch",
        f"--partition={slurm_cluster.partition}",
        f"--gpus-per-node={too_many}",
        f"--output={tmp_path}/never-%j.out",
        "--wrap=true",
    )
    assert result.returncode != 0
    assert "Requested node configuration is not available" in result.stderr
    assert "Submitted batch job" not in result.stdout
