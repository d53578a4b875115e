"""A job's MLflow run ends in the job's state, whoever sees the job end first.

The run is created SCHEDULED by `stoker submit` and set RUNNING by the job's
RunLogger; the runtime ends it on its own way out. But a rank killed by SLURM
(its peer failed first, the step was cancelled, the node ran out of memory), a
command that is not the stoker runtime, or a job that never started ends
nothing, and its run would read RUNNING or SCHEDULED for ever. So every party that
sees the job's end calls `end_runs`: the batch script's last line and the local
supervisor (`python -m stoker.tracking.run_end URI RUN_ID STATE [MARK]`), and
`stoker status`, `why` and `logs` when they find the job ended in SLURM. Only a run
still open is changed, so the first to come wins and the others change nothing; a
requeued or restarting job is not ended, so its run stays RUNNING, and `stoker requeue`
of an ended job sets its run RUNNING again (`reopen_run`).

No mlflow import here: the batch script of every job runs this at its end, and
150 short jobs on a 2-core node would spend minutes importing mlflow and opening
its store. A sqlite store gets one conditional UPDATE of MLflow's `runs` table (its
schema has kept `run_uuid`, `status` and `end_time` since MLflow 1.0); a server gets
two calls of its REST API (runs/get, runs/update), with MLflow's own credentials
variables. `MARK` (the run folder's `mlflow-run-ended`) tells `stoker status` that
there is nothing left to do.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sqlite3
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from stoker.errors import StokerError
from stoker.sqlite_retry import retry_while_locked
from stoker.tracking.store import TrackingTarget, resolve_tracking_uri

# MLflow's run statuses for the states a job ends in; any other end state is FAILED.
_RUN_STATUS = {"COMPLETED": "FINISHED", "CANCELLED": "KILLED", "PREEMPTED": "KILLED"}
OPEN_STATUSES = frozenset({"SCHEDULED", "RUNNING"})
# In the run folder once its run is known to be ended (by whoever ended it).
MARK_FILE = "mlflow-run-ended"
_BUDGET_S = 60.0  # a locked sqlite store: retried this long


def run_status_of(job_state: str) -> str:
    """FINISHED, FAILED or KILLED for the SLURM (or local) state a job ended in."""
    return _RUN_STATUS.get(job_state.split()[0].upper(), "FAILED")


def end_runs(target: TrackingTarget, ends: Mapping[str, str]) -> dict[str, str]:
    """`{run_id: job_state}`: end each run still SCHEDULED or RUNNING in the status of its
    job's state. Returns `{run_id: status}` of the runs it ended; a run ended already or
    not in the store is left as it is. Raises StokerError when the store cannot be
    reached or is not an MLflow store."""
    if not ends:
        return {}
    now_ms = int(time.time() * 1000)
    wanted = {run_id: run_status_of(state) for run_id, state in ends.items()}
    if target.db_path is not None:
        return _end_in_sqlite(target, target.db_path, wanted, now_ms)
    return {
        run_id: status
        for run_id, status in wanted.items()
        if _end_on_server(target, run_id, status, now_ms)
    }


def _end_in_sqlite(
    target: TrackingTarget, db: Path, wanted: Mapping[str, str], now_ms: int
) -> dict[str, str]:
    if not db.exists():
        raise StokerError(f"MLflow store {target.describe()}: {db} does not exist")

    def update() -> dict[str, str]:
        ended = {}
        conn = sqlite3.connect(db, timeout=5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for run_id, status in wanted.items():
                cursor = conn.execute(
                    "UPDATE runs SET status = ?, end_time = ? "
                    "WHERE run_uuid = ? AND status IN ('SCHEDULED', 'RUNNING')",
                    (status, now_ms, run_id),
                )
                if cursor.rowcount:
                    ended[run_id] = status
            conn.execute("COMMIT")
        finally:
            conn.close()
        return ended

    try:
        return retry_while_locked(
            update,
            db=db,
            doing=f"end runs in MLflow store {target.describe()}",
            fix="try again; `stoker status` ends them later",
            budget_s=_BUDGET_S,
        )
    except sqlite3.Error as exc:
        raise StokerError(f"MLflow store {target.describe()}: {exc}") from exc


def _end_on_server(target: TrackingTarget, run_id: str, status: str, now_ms: int) -> bool:
    base = target.uri.rstrip("/") + "/api/2.0/mlflow/runs"
    try:
        got = _call(f"{base}/get?run_id={run_id}", None)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False  # no such run: nothing to end
        raise StokerError(f"MLflow server {target.describe()}: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise StokerError(f"MLflow server {target.describe()}: {exc}") from exc
    if got.get("run", {}).get("info", {}).get("status") not in OPEN_STATUSES:
        return False
    body = {"run_id": run_id, "status": status, "end_time": now_ms}
    try:
        _call(f"{base}/update", body)
    except (OSError, ValueError) as exc:
        raise StokerError(f"MLflow server {target.describe()}: {exc}") from exc
    return True


def reopen_run(target: TrackingTarget, run_id: str) -> bool:
    """Set an ended run RUNNING again: its job was requeued (`stoker requeue`) and runs on
    in it, to be ended again in the state it then ends in. Returns whether it changed.
    Raises StokerError as `end_runs`."""
    if target.db_path is not None:
        db = target.db_path

        def update() -> bool:
            conn = sqlite3.connect(db, timeout=5, isolation_level=None)
            try:
                cursor = conn.execute(
                    "UPDATE runs SET status = 'RUNNING', end_time = NULL "
                    "WHERE run_uuid = ? AND status NOT IN ('SCHEDULED', 'RUNNING')",
                    (run_id,),
                )
                return bool(cursor.rowcount)
            finally:
                conn.close()

        try:
            return retry_while_locked(
                update,
                db=db,
                doing=f"reopen run {run_id} in MLflow store {target.describe()}",
                fix="try again",
                budget_s=_BUDGET_S,
            )
        except sqlite3.Error as exc:
            raise StokerError(f"MLflow store {target.describe()}: {exc}") from exc
    base = target.uri.rstrip("/") + "/api/2.0/mlflow/runs"
    try:
        got = _call(f"{base}/get?run_id={run_id}", None)
        if got.get("run", {}).get("info", {}).get("status") in OPEN_STATUSES:
            return False
        _call(f"{base}/update", {"run_id": run_id, "status": "RUNNING"})
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise StokerError(f"MLflow server {target.describe()}: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise StokerError(f"MLflow server {target.describe()}: {exc}") from exc
    return True


def _call(url: str, body: dict[str, Any] | None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    # The variables MLflow's own client reads for a server behind authentication.
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    user, password = (os.environ.get(f"MLFLOW_TRACKING_{k}") for k in ("USERNAME", "PASSWORD"))
    if token:
        headers["Authorization"] = f"Bearer {token}"
    elif user and password:
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        headers["Authorization"] = f"Basic {pair}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers)
    timeout = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or 10)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer = json.loads(response.read() or b"{}")
    return answer if isinstance(answer, dict) else {}


def main(argv: list[str]) -> int:
    """`python -m stoker.tracking.run_end URI RUN_ID JOB_STATE [MARK]`: for the batch
    script and the local supervisor. Never fails the job: a store it cannot reach is
    said on stderr, and `stoker status` ends the run later. MARK is written once the
    run is known to be ended."""
    if len(argv) not in (3, 4):
        print(
            "usage: python -m stoker.tracking.run_end URI RUN_ID JOB_STATE [MARK]",
            file=sys.stderr,
        )
        return 2
    uri, run_id, job_state = argv[:3]
    if not run_id:
        return 0
    try:
        ended = end_runs(resolve_tracking_uri(uri or None), {run_id: job_state})
    except StokerError as exc:
        print(f"stoker: could not end MLflow run {run_id}: {exc}", file=sys.stderr)
        return 0
    if ended:
        print(f"stoker: MLflow run {run_id} ended {ended[run_id]}", file=sys.stderr)
    if len(argv) == 4:
        with contextlib.suppress(OSError):  # the mark is only a shortcut for `stoker status`
            Path(argv[3]).touch()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
