"""`stoker cancel` and `stoker requeue`: SLURM's commands, through the ledger."""

from __future__ import annotations

from pathlib import Path

from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.slurm.cli import SlurmError, run_slurm


def _record(job_id: str, ledger: Ledger) -> JobRecord:
    # "123_4" is a task of array job 123.
    return ledger.get(job_id) or ledger.require(job_id.split("_")[0])


def cancel(job_id: str, ledger: Ledger | None = None) -> str:
    """Cancel a job (all tasks of an array, or one with 123_4). Returns what was done."""
    ledger = ledger or Ledger()
    record = _record(job_id, ledger)
    if record.backend == "local":
        from stoker.launcher.local.backend import cancel_local

        if not cancel_local(Path(record.run_dir)):
            raise StokerError(
                f"local job {job_id} is not running", fix="`stoker status` shows its state"
            )
        return f"cancelled local job {job_id}"
    run_slurm(["scancel", job_id])
    return f"cancelled job {job_id}"


def requeue(job_id: str, *, hold: bool = False, ledger: Ledger | None = None) -> str:
    """Requeue a running or finished job; it restarts from its last checkpoint.

    SLURM keeps a requeued batch job pending for about two minutes (its BeginTime);
    unless `hold`, that wait is lifted so the job starts as soon as resources allow.
    """
    ledger = ledger or Ledger()
    record = _record(job_id, ledger)
    if record.backend == "local":
        raise StokerError(
            f"{job_id} ran with --local; only SLURM jobs can be requeued",
            fix="submit it again with `stoker submit --local`",
        )
    try:
        run_slurm(["scontrol", "requeuehold" if hold else "requeue", job_id])
    except SlurmError as exc:
        raise StokerError(
            f"SLURM did not requeue job {job_id}: {exc.stderr or exc}",
            fix="a job can be requeued while it runs or after it ended, if the cluster "
            "allows requeue (`stoker doctor`) and the job is still known to SLURM",
        ) from exc
    ledger.reopen(record.job_id)
    if hold:
        return f"requeued job {job_id} and held it (`scontrol release {job_id}` starts it)"
    if _release_hold(job_id):
        return f"requeued job {job_id}"
    return f"requeued job {job_id} (SLURM holds it for its credential lifetime, ~2 min)"


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
