"""The example plugin model (examples/own_model, not a built-in) on the real cluster, 2
nodes x 2 ranks (HSDP over gloo), both ways a user gets it there: installed with pip
(an uninterrupted run), and imported by name from the job's code snapshot, requeued
mid-run with `scontrol requeue`: that one resumes from its last verified checkpoint and
its losses equal the uninterrupted run's bit for bit, in one MLflow run with every
logged step once."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.data.synthetic.shapes import synth_dataset
from tests.faults.training_jobs import (
    committed_steps,
    loss_history,
    resumed_step,
    run_logs,
    starts,
)
from tests.launcher_jobs import submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
OWN_MODEL = Path(__file__).resolve().parents[2] / "examples" / "own_model"
STEPS = 16


def test_the_plugin_model_resumes_bit_exact_after_a_requeue_under_hsdp(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    synth_dataset(str(data), clips=32, seconds=1.0, size=(32, 32), fps=8)
    common = [
        "model.arch=own_model.denoiser:build", "model.args.width=8", f"data.url={data}",
        "data.batch_size=8", "data.num_workers=0", "data.clip_seconds=0.5",
        "data.resolution=[32,32]", f"train.steps={STEPS}", "train.log_every=1",
        "checkpoint.every=4", "checkpoint.keep_last=100", "optim.lr=1e-3",
        "--nodes", "2", "--ntasks-per-node", "2", "--time", "10",
    ]  # fmt: skip
    # Installed with pip (into a folder the job puts on its PYTHONPATH), submitted from a
    # folder without it: the import can only find the installed package.
    source, installed, elsewhere = tmp_path / "src", tmp_path / "site", tmp_path / "work"
    shutil.copytree(OWN_MODEL, source)
    elsewhere.mkdir()
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--target", str(installed), str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    # Each job takes both CPUs of two of the three nodes: one runs at a time. The requeued
    # one first: the uninterrupted one runs while the requeue holds it (cred_expire).
    job = submit_json(*common, cwd=OWN_MODEL, in_process=True)
    whole = submit_json(*common, f"job.env.PYTHONPATH={installed}", cwd=elsewhere, in_process=True)
    run_dir = Path(job["run_dir"])
    # The plugin comes with the job's code (the repository, snapshot at submit; the tasks
    # run in its examples/own_model, where `own_model` imports by name).
    assert (run_dir / "code" / "examples" / "own_model" / "own_model" / "denoiser.py").is_file()

    wait_for(lambda: max(committed_steps(run_dir), default=0) >= 8, 600, "step-8 committed")
    subprocess.run(["scontrol", "requeue", job["job_id"]], check=True, timeout=60)
    assert wait_final(whole["job_id"], 600) == "COMPLETED", run_logs(Path(whole["run_dir"]))
    assert not (Path(whole["run_dir"]) / "code" / "own_model").exists()
    assert wait_final(job["job_id"], 900, run_dir) == "COMPLETED", run_logs(run_dir)

    assert [restart for _, restart, _ in starts(run_dir)] == [0, 1]
    resumed = resumed_step(run_dir, 1)
    assert resumed is not None and resumed >= 8, run_logs(run_dir)
    requeued, uninterrupted = loss_history(job["run_id"]), loss_history(whole["run_id"])
    # A loss per step (a window's mean would span the stop), each once.
    assert [s for s, _ in requeued] == list(range(1, STEPS + 1)), "every step once"
    assert requeued == uninterrupted  # bit for bit
