"""After every fault test: no MLflow run of an ended job is left SCHEDULED or RUNNING.

A run the job's own end did not close (a job cancelled while pending, a batch script
killed) is closed by the first `stoker status`, `why` or `logs` that sees the job ended
(docs/jobs.md). So: list the open runs of the test's default store, run `stoker status
--all` as a user would next, and fail for any run still open whose job has ended."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.clirun import stoker

OPEN = ("SCHEDULED", "RUNNING")
# Job states after which nothing runs (sacct's, and the local supervisor's).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE", "KILLED"}  # fmt: skip


def _open_runs(store: Path) -> dict[str, str]:
    """run id -> status of the store's active runs that are SCHEDULED or RUNNING."""
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=30) as db:
        rows = db.execute(
            "SELECT run_uuid, status FROM runs WHERE lifecycle_stage = 'active' "
            f"AND status IN {OPEN!r}"
        ).fetchall()
    return dict(rows)


@pytest.fixture(autouse=True)
def no_open_run_of_an_ended_job(isolated_home: Path) -> Iterator[None]:
    yield
    store = isolated_home / ".stoker" / "mlflow" / "mlflow.db"
    if not store.exists() or not _open_runs(store):
        return
    listed = stoker("status", "--all", "--json", timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    jobs = {row["mlflow_run_id"]: row for row in json.loads(listed.stdout) if row["mlflow_run_id"]}
    left = {
        run_id: (status, jobs[run_id]["job_id"], jobs[run_id]["state"])
        for run_id, status in _open_runs(store).items()
        if run_id in jobs and jobs[run_id]["state"] in ENDED
    }
    assert not left, f"MLflow runs still open after their job ended: {left}"
