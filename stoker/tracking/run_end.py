"""A job's MLflow run ends in the job's state, whoever sees the job end first.

The run is created SCHEDULED by `stoker submit` and set RUNNING by the job's
RunLogger; the runtime ends it on its own way out. But a rank killed by SLURM
(its peer failed first, the step was cancelled, the node ran out of memory), a
command that is not the stoker runtime, or a job that never started ends
nothing, and its run would read RUNNING or SCHEDULED for ever. So every party that
sees the job's end calls `end_runs`: the batch script's last line and the local
supervisor (`python -m stoker.tracking.run_end URI RUN_ID STATE`), and `stoker
status`, `why` and `logs` when they find the job ended in SLURM. Only a run still
open is changed, so the first to come wins and the others change nothing; a
requeued or restarting job is not ended, so its run stays RUNNING.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from stoker.errors import StokerError
from stoker.tracking.store import TrackingTarget, open_store, resolve_tracking_uri, store_errors

# MLflow's run statuses for the states a job ends in; any other end state is FAILED.
_RUN_STATUS = {"COMPLETED": "FINISHED", "CANCELLED": "KILLED", "PREEMPTED": "KILLED"}
OPEN_STATUSES = frozenset({"SCHEDULED", "RUNNING"})


def run_status_of(job_state: str) -> str:
    """FINISHED, FAILED or KILLED for the SLURM (or local) state a job ended in."""
    return _RUN_STATUS.get(job_state.split()[0].upper(), "FAILED")


def end_runs(target: TrackingTarget, ends: Mapping[str, str]) -> dict[str, str]:
    """`{run_id: job_state}`: end each run still SCHEDULED or RUNNING in the status of its
    job's state. Returns `{run_id: status}` of the runs it ended. A run that no longer
    exists is skipped. Raises StokerError when the store cannot be reached."""
    from mlflow.exceptions import MlflowException

    ended: dict[str, str] = {}
    if not ends:
        return ended
    with open_store(target, None) as (client, _), store_errors(target, "end the job's run"):
        for run_id, job_state in ends.items():
            try:
                run = client.get_run(run_id)
            except MlflowException as exc:
                if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                    continue
                raise
            if run.info.status not in OPEN_STATUSES:
                continue  # ended already: by the runtime, or by another observer
            status = run_status_of(job_state)
            client.set_terminated(run_id, status=status)
            ended[run_id] = status
    return ended


def main(argv: list[str]) -> int:
    """`python -m stoker.tracking.run_end URI RUN_ID JOB_STATE`: for the batch script
    and the local supervisor. Never fails the job: a store it cannot reach is said on
    stderr, and `stoker status` ends the run later."""
    if len(argv) != 3:
        print("usage: python -m stoker.tracking.run_end URI RUN_ID JOB_STATE", file=sys.stderr)
        return 2
    uri, run_id, job_state = argv
    if not run_id:
        return 0
    try:
        ended = end_runs(resolve_tracking_uri(uri or None), {run_id: job_state})
    except StokerError as exc:
        print(f"stoker: could not end MLflow run {run_id}: {exc}", file=sys.stderr)
        return 0
    if ended:
        print(f"stoker: MLflow run {run_id} ended {ended[run_id]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
