"""`stoker cancel` and `stoker requeue`: SLURM's commands, through the ledger."""

from __future__ import annotations

import shlex
from pathlib import Path

from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.slurm.cli import SlurmError, run_slurm
from stoker.tracking.run_end import MARK_FILE


def _record(job_id: str, ledger: Ledger) -> JobRecord:
    # "123_4" is a task of array job 123.
    return ledger.get(job_id) or ledger.require(job_id.split("_")[0])


def cancel(job_id: str, ledger: Ledger | None = None) -> str:
    """Cancel a job (all tasks of an array, or one with 123_4). Returns what was done:
    a job that had already ended is left as it is and said to have ended, in its state
    (not an error: what `cancel` is for, a job that no longer runs, holds)."""
    ledger = ledger or Ledger()
    record = _record(job_id, ledger)
    if record.backend == "local":
        from stoker.launcher.local.backend import cancel_local
        from stoker.launcher.local.state import read_local_state

        if cancel_local(Path(record.run_dir)):
            return f"cancelled local job {job_id}"
        local = read_local_state(RunDir(Path(record.run_dir)))
        if local is not None and local.state != "RUNNING":
            return _already_ended(job_id, [local.state])
        raise StokerError(
            f"local job {job_id} is not running", fix="`stoker status` shows its state"
        )
    ended = _ended_states(job_id, record)
    if ended:
        return _already_ended(job_id, ended)
    run_slurm(["scancel", job_id])
    return f"cancelled job {job_id}"


def _already_ended(job_id: str, states: list[str]) -> str:
    return f"job {job_id} had already ended ({', '.join(states)}); nothing to cancel"


def _ended_states(job_id: str, record: JobRecord) -> list[str]:
    """The end states of `job_id` (of each task of an array) when every one has ended;
    [] while any may still run, or when SLURM does not say (then scancel speaks)."""
    from stoker.launcher.slurm.query import TERMINAL_STATES, query_accounting, query_queue

    try:
        states = [row.state for row in query_queue([job_id]).values()]
        if not states:  # ended longer ago than slurmctld keeps jobs (MinJobAge)
            states = [rows[-1].state for rows in query_accounting([job_id]).values() if rows]
    except SlurmError:
        states = []
    if not states and record.final_state and job_id == record.job_id:
        states = [record.final_state]
    if states and all(state in TERMINAL_STATES for state in states):
        return sorted(set(states))
    return []


def requeue(job_id: str, *, hold: bool = False, ledger: Ledger | None = None) -> str:
    """Requeue a running or finished job: it runs again in its run folder and continues
    from its newest checkpoint there. A local job is run again by a new supervisor.

    SLURM keeps a requeued batch job pending for about two minutes (its BeginTime);
    unless `hold`, that wait is lifted so the job starts as soon as resources allow.
    """
    ledger = ledger or Ledger()
    record = _record(job_id, ledger)
    if record.backend == "local":
        return _requeue_local(job_id, record, hold=hold, ledger=ledger)
    try:
        run_slurm(["scontrol", "requeuehold" if hold else "requeue", job_id])
    except SlurmError as exc:
        raise StokerError(
            f"SLURM did not requeue job {job_id}: {exc.stderr or exc}",
            fix="a job can be requeued while it runs or after it ended, if the cluster "
            "allows requeue (`stoker doctor`) and SLURM still knows the job (MinJobAge); "
            f"else {_resubmit_fix(job_id, record)}",
        ) from exc
    ledger.reopen(record.job_id)
    problems = _reopen_runs(job_id, ledger)
    if hold:
        return (
            f"requeued job {job_id} and held it (`scontrol release {job_id}` starts it){problems}"
        )
    if _release_hold(job_id):
        return f"requeued job {job_id}{problems}"
    return f"requeued job {job_id} (SLURM holds it for its credential lifetime, ~2 min){problems}"


def _resubmit_fix(job_id: str, record: JobRecord) -> str:
    """How a new submission continues from the checkpoints of `job_id` (a task of an
    array keeps its own, in its task folder)."""
    run = RunDir(Path(record.run_dir))
    task = job_id.partition("_")[2]
    if task.isdigit():
        run = run.task(int(task))
    elif record.array_size:
        return (
            f"submit each task again with its checkpoint.root (`stoker why {job_id}_<i>` "
            "names it) to continue from its checkpoints"
        )
    setting = shlex.quote(f"checkpoint.root={run.checkpoint_root()}")
    return f"submit it again with {setting} to continue from its checkpoints"


def _requeue_local(job_id: str, record: JobRecord, *, hold: bool, ledger: Ledger) -> str:
    from stoker.launcher.local.backend import requeue_local

    if hold:
        raise StokerError(
            f"--hold is for SLURM jobs; {job_id} is a local job, which no scheduler holds",
            fix=f"`stoker requeue {job_id}` without --hold",
        )
    restart = requeue_local(Path(record.run_dir))
    ledger.reopen(record.job_id)
    problems = _reopen_runs(job_id, ledger)
    return f"requeued local job {job_id}: restart {restart} runs in {record.run_dir}{problems}"


def _reopen_runs(job_id: str, ledger: Ledger) -> str:
    """The requeued job's MLflow runs, ended with its last start, RUNNING again: its next
    end ends them in its state then (a plain command's run stayed KILLED otherwise).
    Returns what could not be done, for the requeue's message ("" when all went well)."""
    from stoker.launcher.jobs.targets import select_jobs
    from stoker.tracking.run_end import reopen_run
    from stoker.tracking.store import resolve_tracking_uri

    problems = []
    for target in select_jobs(ledger, [job_id]):
        (target.run.path / MARK_FILE).unlink(missing_ok=True)
        run_id, uri = target.mlflow_run_id, target.record.tracking_uri
        if not run_id or not uri:
            continue
        try:
            reopen_run(resolve_tracking_uri(uri), run_id)
        except StokerError as exc:
            # The job runs again all the same; the stoker runtime marks its run RUNNING.
            problems.append(f"; its MLflow run {run_id} stays ended ({exc.message})")
    return "".join(problems)


def _release_hold(job_id: str, timeout: float = 10.0) -> bool:
    """Lift SLURM's hold on a requeued job (BeginTime) once it is PENDING again.

    Not at once: a job restarted within the second of its requeue is killed by
    slurmd ("Job credential revoked"). Wait until the old start has ended and at
    least a second has passed, then set StartTime=now.
    """
    import time

    started = time.monotonic()
    while time.monotonic() - started < timeout:
        time.sleep(1.0)
        try:
            info = run_slurm(["scontrol", "show", "job", "-o", job_id])
        except SlurmError:
            return False
        if "JobState=PENDING" in info and "Reason=BeginTime" in info:
            try:
                run_slurm(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
            except SlurmError:
                return False
            return True
    return False
