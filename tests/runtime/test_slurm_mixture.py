"""Real-world data on the real cluster: 2 ranks train the built-in model from a mixture
of two data sets (square 2 s clips and wide 1 s ones) with buckets of both shapes,
loader workers on; the job is requeued mid-run (`scontrol requeue`) and resumes from
its last checkpoint with exactly the sample sequence of an uninterrupted run: the same
losses bit for bit and the same samples taken from each data set at every step. MLflow
shows both data sets as the run's dataset inputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.data.synthetic.shapes import synth_dataset
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
STEPS = 12


def _history(run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in mlflow_client().get_metric_history(run_id, key))


def test_a_bucketed_mixture_resumes_with_the_same_samples_after_a_requeue(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    square, wide = tmp_path / "square", tmp_path / "wide"
    synth_dataset(str(square), clips=16, seconds=2.0, size=(32, 32), fps=4, sample_rate=8000,
                  samples_per_shard=6)  # fmt: skip
    synth_dataset(str(wide), clips=10, seconds=1.0, size=(32, 64), fps=4, sample_rate=8000,
                  samples_per_shard=4, seed=1)  # fmt: skip
    common = [
        f"data.sources=[{{name: square, url: {square}, weight: 2}}, "
        f"{{name: wide, url: {wide}, weight: 1}}]",
        "data.buckets=[{resolution: [32, 32], clip_seconds: 1, batch_size: 4}, "
        "{resolution: [32, 64], clip_seconds: 1, batch_size: 2}]",
        "data.num_workers=1", "data.fps=4", "data.sample_rate=8000", "data.resolution=[32,64]",
        f"train.steps={STEPS}", "train.log_every=1", "checkpoint.every=4",
        "checkpoint.keep_last=100", "--nodes", "2", "--ntasks-per-node", "1", "--time", "10",
    ]  # fmt: skip
    job = submit_json(*common, cwd=tmp_path, in_process=True)
    run_dir = Path(job["run_dir"])
    wait_for(lambda: max(committed_steps(run_dir), default=0) >= 4, 600, "step-4 committed")
    subprocess.run(["scontrol", "requeue", job["job_id"]], check=True, timeout=60)
    # The uninterrupted run, while the requeue holds the job (cred_expire): the two fit side
    # by side (a CPU of two nodes each, of three nodes of two CPUs).
    whole = submit_json(*common, cwd=tmp_path, in_process=True)
    assert wait_final(job["job_id"], 900, run_dir) == "COMPLETED", run_logs(run_dir)
    assert wait_final(whole["job_id"], 600) == "COMPLETED", run_logs(Path(whole["run_dir"]))

    assert [restart for _, restart, _ in starts(run_dir)] == [0, 1]
    resumed = resumed_step(run_dir, 1)
    assert resumed is not None and resumed >= 4, run_logs(run_dir)
    requeued, uninterrupted = loss_history(job["run_id"]), loss_history(whole["run_id"])
    assert [s for s, _ in requeued] == list(range(1, STEPS + 1)), "every step once"
    assert requeued == uninterrupted  # bit for bit
    for name in ("square", "wide"):
        key = f"data/source/{name}/samples"
        taken = _history(job["run_id"], key)
        assert taken == _history(whole["run_id"], key), key
        assert taken[-1][1] > 0, f"{name} gave no sample"
    # Both data sets are the run's dataset inputs, each once despite the requeue.
    inputs = mlflow_client().get_run(job["run_id"]).inputs.dataset_inputs
    assert sorted(i.dataset.name for i in inputs) == ["square", "wide"], inputs
    # With each one's samples per bucket: square clips in the square bucket, wide in the wide.
    profiles = {i.dataset.name: json.loads(i.dataset.profile) for i in inputs}
    assert profiles["square"]["bucket 32x32x1s"] == 16, profiles
    assert profiles["square"]["bucket 32x64x1s"] == 0, profiles
    assert profiles["wide"]["bucket 32x64x1s"] == 10, profiles
