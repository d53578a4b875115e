"""The Python API (stoker/api.py) against the real cluster: submit, wait, read the logs,
ask why, cancel, list; the same launcher code as the CLI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import stoker
from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import Ledger
from tests.launcher_jobs import mlflow_status, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
PRINT_RANK = "import os; print('hello from', os.environ['RANK'], flush=True)"


def test_submit_wait_logs_why_cancel_and_list(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    job = stoker.submit(
        command=[sys.executable, "-c", PRINT_RANK], nodes=1, ntasks_per_node=2, time="5",
        cwd=tmp_path,
    )  # fmt: skip
    # Submitted at once: the two jobs run side by side (3 CPUs of the cluster's 6).
    failing = stoker.submit(
        command=[sys.executable, "-c", "raise SystemExit('bad input: x')"], time="5",
        cwd=tmp_path,
    )  # fmt: skip
    assert job.job_id.isdigit() and job.run_id and job.run_dir.is_dir()
    assert job.wait(timeout=300) == "COMPLETED"
    assert job.state() == "COMPLETED"
    assert "[1] hello from 1" in job.logs(rank=1)
    assert not any(line.startswith("[0] ") for line in job.logs(rank=1))
    # One rank's lines are that rank's: not the batch script's.
    assert job.logs(rank=0) == ["[0] hello from 0"]
    assert job.why()["cause"] == "completed"

    assert failing.wait(timeout=300) == "FAILED"
    why = failing.why()
    assert why["state"] == "FAILED" and "bad input: x" in " ".join(why["evidence"]), why

    sleeper = stoker.submit(command=["sleep", "300"], time="5", cwd=tmp_path)
    assert sleeper.state() in ("PENDING", "RUNNING")
    with pytest.raises(TimeoutError, match=f"job {sleeper.job_id} is still"):
        sleeper.wait(timeout=1)
    assert Ledger().require(sleeper.job_id).name == "sleep"  # named after its command
    # Cancelled once it runs: its batch script, not a rank, ends its MLflow run.
    started = sleeper.run_dir / "logs" / "r0" / "rank-0.log"
    wait_for(started.exists, 120, "the sleeper to start")
    assert sleeper.cancel() == f"cancelled job {sleeper.job_id}"
    assert sleeper.wait(timeout=120) == "CANCELLED"
    batch_log = (sleeper.run_dir / "logs" / "batch.log").read_text()
    assert f"stoker: MLflow run {sleeper.run_id} ended KILLED" in batch_log, batch_log
    assert sleeper.run_id and mlflow_status(sleeper.run_id) == "KILLED"
    # Cancelling an ended job says so, and cancels nothing.
    assert sleeper.cancel() == (
        f"job {sleeper.job_id} had already ended (CANCELLED); nothing to cancel"
    )
    assert sleeper.why()["fix"] == (
        f"nothing failed; `stoker requeue {sleeper.job_id}` runs it again in its run folder, "
        "where it continues from its newest checkpoint; once SLURM has forgotten it "
        f"(MinJobAge), submit it again with checkpoint.root={sleeper.run_dir}/checkpoints (a "
        "new run folder has no checkpoints of its own)"
    )

    listed = [j.job_id for j in stoker.jobs(limit=10)]
    assert listed[:3] == [sleeper.job_id, failing.job_id, job.job_id]  # newest first


def test_bad_arguments_are_stoker_errors(tmp_path: Path) -> None:
    with pytest.raises(StokerError, match=r"job\.nodes"):
        stoker.submit(nodes=0, command=["true"], cwd=tmp_path)
    with pytest.raises(StokerError, match="pass a list"):
        stoker.submit(overrides="train.steps=5", cwd=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(StokerError, match="pass a list"):
        stoker.sweep(None, "train.seed=1,2", cwd=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(StokerError, match="no sweep axis"):
        stoker.sweep(None, ["train.seed=1"], command=["true"], cwd=tmp_path)
    # What `stoker submit` checks before queueing, the API checks too.
    with pytest.raises(StokerError, match=f"{tmp_path / 'train.py'} does not exist"):
        stoker.submit(command=["python", "train.py"], cwd=tmp_path)
    with pytest.raises(StokerError, match=r"data\.url '/no/such/set' \(override .*does not exist"):
        stoker.submit(overrides=["data.url=/no/such/set"], command=["true"], cwd=tmp_path)
    with pytest.raises(StokerError) as spaced:  # its fix's commands paste as they are
        stoker.submit(overrides=["data.url=/no/such set"], command=["true"], cwd=tmp_path)
    assert "`stoker data synth '/no/such set'`" in str(spaced.value.fix)


PRINT_SEED = (
    "import os, yaml; cfg = yaml.safe_load(open(os.environ['STOKER_CONFIG'])); "
    "print('seed', cfg['train']['seed'], flush=True)"
)


def test_a_sweep_is_one_job_per_task(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    tasks = stoker.sweep(
        None, ["train.seed=11,12"], command=[sys.executable, "-c", PRINT_SEED], time="5",
        cwd=tmp_path,
    )  # fmt: skip
    array = tasks[0].job_id.split("_")[0]
    assert [t.job_id for t in tasks] == [f"{array}_0", f"{array}_1"]
    assert len({t.run_id for t in tasks}) == 2 and all(t.run_dir.is_dir() for t in tasks)
    assert [t.wait(timeout=300) for t in tasks] == ["COMPLETED", "COMPLETED"]
    assert "[0] seed 11" in tasks[0].logs(rank=0) and "[0] seed 12" in tasks[1].logs(rank=0)
