"""The example own loop (examples/own_loop/train.py: plain PyTorch and `stoker.job`) on
the real cluster, 2 nodes x 2 ranks (HSDP over gloo), submitted as a command: requeued
mid-run with `scontrol requeue`, it resumes from its last verified checkpoint with the
losses of an uninterrupted run bit for bit, in one MLflow run with every step once;
`stoker status` shows its step and loss."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.data.synthetic.shapes import synth_dataset
from tests.clirun import stoker
from tests.faults.training_jobs import (
    committed_steps,
    loss_history,
    mlflow_client,
    resumed_step,
    run_logs,
    starts,
)
from tests.launcher_jobs import submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[3]
EXPERIMENT = str(REPO / "examples" / "own_loop" / "experiment.yaml")
STEPS = 16


def test_the_own_loop_resumes_bit_exact_after_a_requeue_under_hsdp(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    synth_dataset(str(data), clips=32, seconds=1.0, size=(32, 32), fps=8)
    common = [
        EXPERIMENT, f"data.url={data}", "data.num_workers=0", "data.clip_seconds=0.5",
        f"train.steps={STEPS}", "train.log_every=1", "checkpoint.every=4",
        "checkpoint.keep_last=100", "--nodes", "2", "--ntasks-per-node", "2", "--time", "10",
        "--", sys.executable, "examples/own_loop/train.py", "--width", "256",
    ]  # fmt: skip
    # Each takes both CPUs of two of the three nodes: one runs at a time. The requeued job
    # first, so that the uninterrupted one runs while the requeue holds it (cred_expire).
    job = submit_json(*common, cwd=REPO, in_process=True)
    whole = submit_json(*common, cwd=REPO, in_process=True)
    run_dir = Path(job["run_dir"])
    wait_for(lambda: max(committed_steps(run_dir), default=0) >= 8, 600, "step-8 committed")
    status = json.loads(stoker("status", job["job_id"], "--json", check=True).stdout)[0]
    assert status["step"] >= 8 and status["loss"] is not None, status
    subprocess.run(["scontrol", "requeue", job["job_id"]], check=True, timeout=60)
    assert wait_final(job["job_id"], 900, run_dir) == "COMPLETED", run_logs(run_dir)
    assert wait_final(whole["job_id"], 600) == "COMPLETED", run_logs(Path(whole["run_dir"]))

    assert [restart for _, restart, _ in starts(run_dir)] == [0, 1]
    resumed = resumed_step(run_dir, 1)
    assert resumed is not None and resumed >= 8, run_logs(run_dir)
    run = mlflow_client().get_run(job["run_id"])
    assert run.info.status == "FINISHED"
    # Four ranks on two nodes: HSDP, a (replicate 2, shard 2) mesh.
    assert (run.data.tags["stoker.world_size"], run.data.tags["stoker.nodes"]) == ("4", "2")
    requeued, uninterrupted = loss_history(job["run_id"]), loss_history(whole["run_id"])
    assert [s for s, _ in requeued] == list(range(1, STEPS + 1)), "every step once"
    assert requeued == uninterrupted  # bit for bit
    final = json.loads(stoker("status", job["job_id"], "--json", check=True).stdout)[0]
    assert final["state"] == "COMPLETED" and final["step"] == STEPS, final
