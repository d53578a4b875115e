"""Preemption and time limits end to end on the real cluster, with the real
runtime and checkpoints: a 2-node job requeued twice by `scontrol requeue` (as
preemption does: SIGTERM, then SIGKILL after KillWait) and at least once by its
time limit (USR2 before it, a save, exit 75, the batch script's requeue) resumes
each time from its newest committed checkpoint into the same MLflow run. Its loss
curve equals an uninterrupted run's bit for bit (CPU, fp32, fixed seed), and
MLflow holds every logged step exactly once. The EMA of the weights
(train.ema_decay) ends equal to the uninterrupted run's, bit for bit.

SLURM sends a time limit's USR2 at its next check of the limits, up to 30 s after it is
due. Rather than a job of hundreds of steps that outlasts that wait on any machine, the
start that meets the time limit is paused (SIGSTOP, as a node too busy to schedule the
ranks) from its first checkpoint of its own until the batch script has the USR2: the
ranks then go on with the signal pending and stop as they would have mid-step."""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from stoker.checkpoint.export import read_weights
from tests.clirun import stoker
from tests.faults.training_jobs import (
    FAST,
    TINY,
    TWO_NODES,
    committed_steps,
    kill_task,
    link_synthetic_data,
    loss_history,
    mlflow_client,
    rank_pid,
    resumed_step,
    starts,
)
from tests.launcher_jobs import (
    FINAL_STATES,
    run_story,
    scontrol_job,
    submit_json,
    wait_final,
    wait_for,
)

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
# Three starts stop, each some steps after a checkpoint of its own (every 5): about 10
# steps a start here, at most ~20 on a fast machine. The last start trains the rest.
STEPS = 80
LOG_EVERY = 1  # a loss per step: a window mean would span a stop
GRACE_S = 120  # job.stop_grace, and the third start's time limit (whole minutes)
# Loader workers on: SLURM signals every process of a step (TERM on a requeue, and the
# batch script forwards the time limit's USR2); the workers must outlive both.
COMMON = [TINY, *FAST, "data.num_workers=1", f"train.steps={STEPS}",
          f"train.log_every={LOG_EVERY}", "checkpoint.every=5", "checkpoint.keep_last=1000",
          "train.ema_decay=0.95", *TWO_NODES]  # fmt: skip


def test_requeues_and_time_limits_resume_bit_exact_into_one_run(
    slurm_cluster: ClusterSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    link_synthetic_data(tmp_path_factory, *FAST)
    # Submitted side by side: one `stoker submit` took 18 s on the loaded VM.
    with ThreadPoolExecutor(2) as pool:
        submitted = pool.submit(submit_json, *COMMON, "--time", "15",
                                f"job.stop_grace={GRACE_S}", "job.max_requeues=20",
                                cwd=tmp_path)  # fmt: skip
        reference = pool.submit(submit_json, *COMMON, "--time", "15", cwd=tmp_path).result()
        job = submitted.result()
    job_id, run_dir = job["job_id"], Path(job["run_dir"])
    events = run_dir / "events"

    for _ in range(2):
        # Once the running start has committed a checkpoint of its own: preempt it.
        wait_for(lambda: _running_with_own_commit(job_id, run_dir), 240,
                 "a start that committed a checkpoint")  # fmt: skip
        count = len(starts(run_dir))
        subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True)
        wait_for(lambda c=count: len(starts(run_dir)) > c, 180, "the next start")

    # The third start reaches its time limit. As it begins, its limit drops to GRACE_S,
    # so SLURM's USR2 (--signal=B:USR2@GRACE_S) is due at once; SLURM sends it at its
    # next check (every 30 s), and the job has GRACE_S to save before the limit kills it.
    # The waiting in a natural limit would be 1-2 minutes.
    subprocess.run(["scontrol", "update", f"JobId={job_id}", f"TimeLimit={GRACE_S // 60}"],
                   check=True, capture_output=True)  # fmt: skip
    _pause_until_the_time_limits_signal(job_id, run_dir)
    wait_for(lambda: "requeued after time limit" in _text(events)
             or scontrol_job(job_id).get("JobState") in FINAL_STATES, 240,
             "the time limit's requeue")  # fmt: skip
    # Back to a far limit while it waits out its requeue hold (cred_expire).
    subprocess.run(["scontrol", "update", f"JobId={job_id}", "TimeLimit=15"],
                   check=True, capture_output=True)  # fmt: skip

    assert wait_final(job_id, 900, run_dir) == "COMPLETED", run_story(run_dir)
    assert wait_final(reference["job_id"], 300) == "COMPLETED"
    log = _text(events)
    assert log.count("stop requested: SIGTERM") >= 2, log
    assert "requeued after time limit" in log, log

    # Each start resumed from the newest checkpoint committed before it began.
    commits = committed_steps(run_dir)
    history = starts(run_dir)
    for began, restart, _ in history[1:]:
        newest = max(step for step, at in commits.items() if at < began)
        assert resumed_step(run_dir, restart) == newest, (restart, newest)
        text = (run_dir / "logs" / f"r{restart}" / "rank-0.log").read_text()
        assert f"MLflow run {job['run_id']}" in text  # the same run, every start
    assert resumed_step(run_dir, 0) is None and len(history) >= 4

    # Bit-exact, and each logged step once: the steps a killed start logged after its
    # last checkpoint are run again on resume, but not logged twice.
    interrupted, straight = loss_history(job["run_id"]), loss_history(reference["run_id"])
    assert [step for step, _ in interrupted] == list(range(LOG_EVERY, STEPS + 1, LOG_EVERY))
    assert interrupted == straight
    final = f"checkpoints/step-{STEPS}"
    ema = read_weights(str(run_dir / final), None, "ema")
    straight_ema = read_weights(str(Path(reference["run_dir"]) / final), None, "ema")
    trained = read_weights(str(run_dir / final), None, "model")
    assert ema.keys() == straight_ema.keys()
    assert all(torch.equal(ema[k], straight_ema[k]) for k in ema)
    assert any(not torch.equal(ema[k], trained[k]) for k in ema)  # an average, not a copy
    run = mlflow_client().get_run(job["run_id"])
    assert run.info.status == "FINISHED"
    status = json.loads(stoker("status", job_id, "--json", check=True).stdout)[0]
    assert status["state"] == "COMPLETED" and status["restarts"] == len(history) - 1
    assert status["step"] == STEPS


def _text(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def _running_with_own_commit(job_id: str, run_dir: Path) -> bool:
    history = starts(run_dir)
    if not history or scontrol_job(job_id).get("JobState") != "RUNNING":
        return False
    return any(at >= history[-1][0] for at in committed_steps(run_dir).values())


def _pause_until_the_time_limits_signal(job_id: str, run_dir: Path) -> None:
    """Once the running start has committed a checkpoint of its own, stop its two ranks
    until the batch script has SLURM's USR2 (it forwards it to them), then continue them.
    A USR2 that came first (a slow start) needs no pause: they stop after a step."""
    events = run_dir / "events"

    def signalled() -> bool:
        return "stop requested: SIGUSR2" in _text(events)

    wait_for(lambda: signalled() or _running_with_own_commit(job_id, run_dir), 240,
             "a checkpoint of the third start's own, or the time limit's USR2")  # fmt: skip
    if signalled():
        return
    restart = starts(run_dir)[-1][1]
    ranks = [rank_pid(run_dir, restart, rank) for rank in (0, 1)]
    for pid, node in ranks:
        kill_task(job_id, node, pid, signal="STOP", check=False)
    try:
        wait_for(signalled, 120, "SLURM's USR2 before the time limit")
    finally:
        for pid, node in ranks:
            kill_task(job_id, node, pid, signal="CONT", check=False)


def test_a_stop_while_the_runtime_starts_saves_and_requeues(
    slurm_cluster: ClusterSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The stop signal as the tasks start, while Python imports torch: before the runtime
    handles SIGUSR2, its default action killed them (seen in CI, a time limit's USR2 soon
    after a requeue). They start with it ignored and find the stop file instead."""
    link_synthetic_data(tmp_path_factory, *FAST)
    job = submit_json(TINY, *FAST, "train.steps=400", "--nodes", "1", "--ntasks-per-node", "2",
                      "--time", "15", cwd=tmp_path, in_process=True)  # fmt: skip
    job_id, run_dir = job["job_id"], Path(job["run_dir"])
    # srun creates the task logs as it starts the tasks: Python is still starting.
    wait_for(lambda: (run_dir / "logs/r0/rank-1.log").exists(), 120, "the tasks to start")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True)

    events = run_dir / "events"
    wait_for(lambda: "requeue" in _text(events)
             or scontrol_job(job_id).get("JobState") in FINAL_STATES, 180,
             "the requeue decision")  # fmt: skip
    subprocess.run(["scancel", job_id], check=False)
    log = (run_dir / "logs/batch.log").read_text()
    assert "User defined signal 2" not in log, log
    assert "requeued after time limit: restart 1" in events.read_text(), log
    # They saved where they stopped, after the first step they ran.
    stopped = committed_steps(run_dir)
    assert len(stopped) == 1 and 1 <= min(stopped) < 400, stopped
