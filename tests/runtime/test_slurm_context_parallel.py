"""Context parallelism on the real cluster (issue [5/8]): 2 nodes x 2 ranks, FSDP over
all four with CP groups of 2 (a ring within each node), requeued mid-run with `scontrol
requeue`: the requeued job resumes from its last verified checkpoint, its losses equal an
uninterrupted run's bit for bit, in one MLflow run with every step once; `stoker sample`
draws from its checkpoint; the checkpoint records the CP degree, and a run at CP 1 on 2
local ranks continues from it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.data.synthetic.shapes import synth_dataset
from tests.clirun import stoker_text
from tests.faults.training_jobs import (
    committed_steps,
    loss_history,
    resumed_step,
    run_logs,
    starts,
)
from tests.launcher_jobs import submit_json, wait_final, wait_for, wait_local

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
STEPS = 12


def test_cp2_resumes_bit_exact_after_a_requeue_and_cp1_continues_its_checkpoint(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    synth_dataset(str(data), clips=32, seconds=1.0, size=(32, 32), fps=8)
    model_and_data = [
        "model.arch=av_dit", "model.size=tiny", f"data.url={data}", "data.batch_size=4",
        "data.num_workers=0", "data.clip_seconds=0.5", "data.resolution=[32,32]",
        "train.precision=fp32", "optim.lr=1e-3",
    ]  # fmt: skip
    common = [
        *model_and_data, f"train.steps={STEPS}", "train.log_every=1",
        "train.context_parallel=2", "train.context_parallel_ulysses=1", "train.sharding=all",
        "checkpoint.every=4", "checkpoint.keep_last=100",
        "--nodes", "2", "--ntasks-per-node", "2", "--time", "10",
    ]  # fmt: skip
    # Each job takes both CPUs of two of the three nodes: one runs at a time. The requeued
    # one first: the uninterrupted one runs while the requeue holds it (cred_expire).
    job = submit_json(*common, in_process=True)
    whole = submit_json(*common, in_process=True)
    run_dir = Path(job["run_dir"])

    wait_for(lambda: max(committed_steps(run_dir), default=0) >= 4, 600, "step-4 committed")
    subprocess.run(["scontrol", "requeue", job["job_id"]], check=True, timeout=60)
    assert wait_final(whole["job_id"], 600) == "COMPLETED", run_logs(Path(whole["run_dir"]))
    assert wait_final(job["job_id"], 900, run_dir) == "COMPLETED", run_logs(run_dir)

    assert [restart for _, restart, _ in starts(run_dir)] == [0, 1]
    resumed = resumed_step(run_dir, 1)
    assert resumed is not None and resumed >= 4, run_logs(run_dir)
    requeued, uninterrupted = loss_history(job["run_id"]), loss_history(whole["run_id"])
    assert [s for s, _ in requeued] == list(range(1, STEPS + 1)), "every step once"
    assert requeued == uninterrupted  # bit for bit

    # `stoker sample` draws from the CP-trained checkpoint in one process (no CP there).
    clips = tmp_path / "clips"
    sampled = stoker_text("sample", job["job_id"], "--seed", "9", "--steps", "1",
                          "--out", str(clips), "--json")  # fmt: skip
    assert sampled.returncode == 0, sampled.stderr[-3000:]
    assert json.loads(sampled.stdout)["step"] == STEPS
    assert (clips / "seed-9.mp4").stat().st_size > 0

    # The checkpoint says how it was trained; CP 1 on one node of 2 ranks resumes it.
    checkpoints = run_dir / "checkpoints"
    commit = json.loads((checkpoints / f"step-{STEPS}" / "COMMIT.json").read_text())
    assert commit["mesh"]["context_parallel"] == 2
    assert commit["mesh"]["context_parallel_ulysses"] == 1
    more = submit_json(
        *model_and_data, f"train.steps={STEPS + 2}", "train.log_every=1",
        f"checkpoint.root={checkpoints}", "--local", "--ntasks-per-node", "2",
    )  # fmt: skip
    local_dir = Path(more["run_dir"])
    assert wait_local(local_dir, 600).state == "COMPLETED", run_logs(local_dir)
    assert resumed_step(local_dir, 0) == STEPS, run_logs(local_dir)
    continued = loss_history(more["run_id"])
    assert [s for s, _ in continued] == [STEPS + 1, STEPS + 2]
