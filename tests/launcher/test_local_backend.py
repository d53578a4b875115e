"""`stoker submit --local`: the SLURM launch (variables, logs, ledger) as local processes.
Each submit is a `stoker` process (its supervisor outlives it); `status` and `cancel`,
which the tests read only for their text and exit status, run in the test process."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from stoker.launcher.jobs.ledger import Ledger
from tests.clirun import stoker_text
from tests.launcher_jobs import JOBS, mlflow_status, submit_json, wait_for, wait_local


def test_local_ranks_all_reduce_with_slurm_layout(tmp_path: Path) -> None:
    job = submit_json(
        "--local",
        "--nodes",
        "2",
        "--ntasks-per-node",
        "2",
        "--",
        sys.executable,
        str(JOBS / "allreduce.py"),
        cwd=tmp_path,
    )
    assert job["job_id"].startswith("local-")
    run_dir = Path(job["run_dir"])
    state = wait_local(run_dir)
    assert state.state == "COMPLETED" and state.ranks == {r: 0 for r in range(4)}
    logs = [(run_dir / "logs" / "r0" / f"rank-{rank}.log").read_text() for rank in range(4)]
    for rank, text in enumerate(logs):
        assert f"rank={rank} " in text and "world=4" in text and "ok=True" in text
    assert "local_rank=1" in (run_dir / "logs" / "r0" / "rank-3.log").read_text()
    # The job's CPU account (as sacct's TotalCPU): every rank's CPU is in it.
    ranks_cpu = sum(float(cpu) for log in logs for cpu in re.findall(r"cpu=([\d.]+)", log))
    assert state.cpu_s is not None and state.cpu_s >= ranks_cpu > 0, (state.cpu_s, ranks_cpu)
    record = Ledger().require(job["job_id"])
    assert record.backend == "local" and record.run_dir == str(run_dir)
    status = json.loads(stoker_text("status", job["job_id"], "--json", check=True).stdout)
    assert status[0]["state"] == "COMPLETED"
    # Not the stoker runtime, so nothing in the job set its run RUNNING or ended it: the
    # supervisor did, before the state file said the job ended.
    assert mlflow_status(job["run_id"]) == "FINISHED"


def test_a_failing_local_rank_stops_the_others(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"
    )
    job = submit_json(
        "--local", "--ntasks-per-node", "3", "--", sys.executable, str(script), cwd=tmp_path
    )
    start = time.monotonic()
    state = wait_local(Path(job["run_dir"]), 30)
    assert time.monotonic() - start < 20, "the sleeping ranks were not stopped"
    assert state.state == "FAILED" and state.exit_code == 3 and state.ranks[1] == 3
    batch = (Path(job["run_dir"]) / "logs" / "batch.log").read_text()
    assert "task 1: Exited with exit code 3" in batch
    assert mlflow_status(job["run_id"]) == "FAILED"
    (row,) = json.loads(stoker_text("status", job["job_id"], "--json", check=True).stdout)
    assert row["reason"] == "rank 1 exited with code 3 (no traceback in its log)"


def test_cancel_stops_a_local_job_and_requeue_continues_it_in_its_run_folder(
    tmp_path: Path,
) -> None:
    """The docs' tour: cancel a local job, `why` says how to continue, and that works:
    `stoker requeue` runs it again in its run folder, from what it saved there."""
    saves = "$STOKER_RUN_DIR/checkpoints/steps"  # where the stoker runtime's would be
    counter = f'mkdir -p "$STOKER_RUN_DIR/checkpoints"; exec {sys.executable} '
    counter += f'{JOBS / "count_steps.py"} "{saves}" 100000 0.1'
    job = submit_json("--local", "--", "bash", "-c", counter, cwd=tmp_path)
    run_dir = Path(job["run_dir"])
    steps = run_dir / "checkpoints" / "steps"
    wait_for(lambda: len(_lines(steps)) >= 2, 60, "the job to save two steps")
    stoker_text("cancel", job["job_id"], check=True)
    state = wait_local(run_dir, 20)
    assert state.state == "CANCELLED"
    assert mlflow_status(job["run_id"]) == "KILLED"
    # Cancelling it again changes nothing and claims nothing.
    again = stoker_text("cancel", job["job_id"])
    assert again.returncode == 0, again.stderr
    assert (
        again.stdout.strip()
        == f"job {job['job_id']} had already ended (CANCELLED); nothing to cancel"
    )

    diagnosis = json.loads(stoker_text("why", job["job_id"], "--json", check=True).stdout)
    assert diagnosis["fix"] == (
        f"nothing failed; `stoker requeue {job['job_id']}` runs it again in its run folder, "
        "where it continues from its newest checkpoint"
    )
    saved = int(_lines(steps)[-1])
    requeued = stoker_text("requeue", job["job_id"], check=True)
    assert f"restart 1 runs in {run_dir}" in requeued.stdout
    rank0 = run_dir / "logs" / "r1" / "rank-0.log"
    wait_for(lambda: "resumes at step" in _text(rank0), 60, "the requeued job to start")
    assert f"rank 0: restart 1 resumes at step {saved}" in _text(rank0)
    (row,) = json.loads(stoker_text("status", job["job_id"], "--json", check=True).stdout)
    assert row["state"] == "RUNNING"
    # Its one MLflow run runs again, to end as this start ends.
    assert mlflow_status(job["run_id"]) == "RUNNING"
    stoker_text("cancel", job["job_id"], check=True)
    assert wait_local(run_dir, 20).state == "CANCELLED"
    assert mlflow_status(job["run_id"]) == "KILLED"


def _lines(path: Path) -> list[str]:
    return _text(path).split()


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_two_local_submits_at_once_get_different_ids(tmp_path: Path) -> None:
    import subprocess

    from tests.clirun import STOKER

    procs = [
        subprocess.Popen(
            [STOKER, "submit", "--local", "--json", "--", "true"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    ids = {
        json.loads(p.communicate(timeout=60)[0].strip().splitlines()[-1])["job_id"] for p in procs
    }
    assert len(ids) == 2
    assert {r.job_id for r in Ledger().list()} == ids


def test_cancel_never_signals_a_process_that_took_a_dead_supervisors_pid(tmp_path: Path) -> None:
    """A supervisor killed outright leaves its state RUNNING; once the pid is reused,
    `stoker cancel` must leave the new process alone (and say the job is not running)."""
    import subprocess

    from tests.launcher_jobs import local_job

    ledger = Ledger()
    stranger = subprocess.Popen(["sleep", "60"])
    try:
        time.sleep(0.1)
        for job_id, started in (("local-old", time.time() - 3600), ("local-live", time.time())):
            local_job(
                ledger,
                tmp_path,
                job_id,
                {"state": "RUNNING", "supervisor_pid": stranger.pid, "started": started},
            )
        # The state is an hour older than the process now holding its pid.
        stale = stoker_text("cancel", "local-old")
        assert stale.returncode == 2 and "is not running" in stale.stderr, stale.stderr
        time.sleep(0.2)
        assert stranger.poll() is None, "cancel signalled a process it did not start"
        # The control: a state as young as the process is its supervisor, and gets TERM.
        stoker_text("cancel", "local-live", check=True)
        assert stranger.wait(10) == -15
    finally:
        stranger.kill()
        stranger.wait()


def test_the_rendezvous_port_is_free_and_below_the_kernels_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not a port the kernel may hand to any process's outgoing connection before rank 0
    listens on it (rank 0's EADDRINUSE failed a job), nor one taken now."""
    import socket

    from stoker.launcher.local import backend

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {backend.rendezvous_port() for _ in range(20)}
    assert all(backend.FIRST_RENDEZVOUS_PORT <= port < low for port in ports), ports
    assert len(ports) > 1  # drawn, not one port for every job
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0 if low <= 20001 else 20001))
        taken.listen()
        held = taken.getsockname()[1] - backend.FIRST_RENDEZVOUS_PORT
        draws = iter([held, 2])
        monkeypatch.setattr(backend.random, "randrange", lambda span: next(draws))
        assert backend.rendezvous_port() == backend.FIRST_RENDEZVOUS_PORT + 2
