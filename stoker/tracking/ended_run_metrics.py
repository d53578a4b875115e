"""Metrics and tags for a run whose job has ended, written by the launcher without
importing mlflow (as run_end.py ends runs): the time account of a job the runtime
could not log it for (a job that failed, was cancelled or hung; a user's own command).

A sqlite store gets rows in MLflow's `metrics`, `latest_metrics` and `tags` tables (their
columns unchanged since MLflow 1.x); a server gets one `runs/log-batch` call.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path

from stoker.errors import StokerError
from stoker.sqlite_retry import retry_while_locked
from stoker.tracking.run_end import _call
from stoker.tracking.store import TrackingTarget

_BUDGET_S = 60.0


def log_to_ended_run(
    target: TrackingTarget,
    run_id: str,
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    step: int,
) -> None:
    """Log `metrics` at `step` and set `tags` on `run_id`. Raises StokerError when the
    store cannot be reached or has no such run."""
    now_ms = int(time.time() * 1000)
    finite = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
    if target.db_path is not None:
        _log_in_sqlite(target, target.db_path, run_id, finite, tags, step, now_ms)
        return
    body = {
        "run_id": run_id,
        "metrics": [
            {"key": k, "value": v, "timestamp": now_ms, "step": step} for k, v in finite.items()
        ],
        "tags": [{"key": k, "value": v} for k, v in tags.items()],
    }
    base = target.uri.rstrip("/") + "/api/2.0/mlflow/runs"
    try:
        _call(f"{base}/log-batch", body)
    except (OSError, ValueError) as exc:
        raise StokerError(f"MLflow server {target.describe()}: {exc}") from exc


def _log_in_sqlite(
    target: TrackingTarget,
    db: Path,
    run_id: str,
    metrics: Mapping[str, float],
    tags: Mapping[str, str],
    step: int,
    now_ms: int,
) -> None:
    if not db.exists():
        raise StokerError(f"MLflow store {target.describe()}: {db} does not exist")

    def write() -> None:
        conn = sqlite3.connect(db, timeout=5, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            if conn.execute("SELECT 1 FROM runs WHERE run_uuid = ?", (run_id,)).fetchone() is None:
                conn.execute("ROLLBACK")
                raise StokerError(f"MLflow store {target.describe()} has no run {run_id}")
            for key, value in metrics.items():
                conn.execute(
                    "INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, step, "
                    "is_nan) VALUES (?, ?, ?, ?, ?, 0)",
                    (key, value, now_ms, run_id, step),
                )
                # The latest value is the one of the highest step (MLflow's own rule).
                conn.execute(
                    "INSERT INTO latest_metrics (key, value, timestamp, step, is_nan, run_uuid) "
                    "VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT (key, run_uuid) DO UPDATE SET "
                    "value = excluded.value, timestamp = excluded.timestamp, "
                    "step = excluded.step WHERE excluded.step >= latest_metrics.step",
                    (key, value, now_ms, step, run_id),
                )
            for key, text in tags.items():
                conn.execute(
                    "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                    (key, text, run_id),
                )
            conn.execute("COMMIT")
        finally:
            conn.close()

    try:
        retry_while_locked(
            write,
            db=db,
            doing=f"log to run {run_id} in {target.describe()}",
            fix="the figures stay in the ledger: `stoker insights` shows them",
            budget_s=_BUDGET_S,
        )
    except sqlite3.Error as exc:
        raise StokerError(f"MLflow store {target.describe()}: {exc}") from exc
