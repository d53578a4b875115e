"""The runs `stoker submit` and `stoker sweep` create in a sqlite store, written with
plain sqlite3: no mlflow import on the login node.

Importing mlflow and opening its sqlite store (mlflow/__init__, SQLAlchemy, alembic)
costs a `stoker submit` 2 to 3 CPU-s, most of the command, on the login node whose
CPU every user's commands share. What a submit writes is a few rows: the run (in
MLflow's `runs`, SCHEDULED), its tags (`mlflow.user`, `mlflow.runName` and stoker's),
its params, and artifact files in the run's artifact folder; later a tag or two, or
its end (FAILED, when sbatch refused the job). `run_end.py` and
`ended_run_metrics.py` write the same tables the same way.

Used only where the result cannot differ from MLflow's own writes:
- the file's `alembic_version` is one of KNOWN_REVISIONS, whose tables hold the
  columns written here (a store of another MLflow version is opened by MLflow);
- the experiment is active, or missing and then created as `open_store` creates it
  (its artifacts in `<artifact_root>/<experiment>`, MLflow's training-layout kind tag);
  a new store, and a deleted experiment's error, go through MLflow;
- the experiment's artifact location is a local folder (MLflow's local artifact
  repository writes plain files there; other locations go through MLflow).
Otherwise `open_direct` returns None and the caller opens the store with MLflow.
tests/tracking/test_direct_runs.py reads the runs made here through MlflowClient and
compares them with runs MLflow made, and holds KNOWN_REVISIONS to the installed
MLflow's schema.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import closing
from pathlib import Path
from typing import TypeVar

from stoker.errors import StokerError
from stoker.sqlite_retry import BUDGET_S, retry_while_locked
from stoker.tracking.store import (
    EXPERIMENT_KIND_TAG,
    TRAINING_KIND,
    TrackingTarget,
    experiment_folder,
)

T = TypeVar("T")

# Alembic revisions of MLflow's schema whose runs, tags, params and experiments tables
# hold the columns written here (the head of MLflow 3.17).
KNOWN_REVISIONS = frozenset({"dc11669786a5"})
# MLflow's tag of the run's name and of its user (mlflow.utils.mlflow_tags).
RUN_NAME_TAG = "mlflow.runName"
USER_TAG = "mlflow.user"
# MLflow's workspace of a store used without workspaces.
DEFAULT_WORKSPACE = "default"


def _now_ms() -> int:
    return int(time.time() * 1000)


class DirectRuns:
    """Runs of one sqlite store, created and changed with sqlite3. Every method is one
    transaction, retried while the file is locked (as store.RetryingClient does)."""

    def __init__(self, target: TrackingTarget, db: Path, experiment_id: str) -> None:
        self.target = target
        self.db = db
        self.experiment_id = experiment_id

    def _write(
        self, doing: str, work: Callable[[sqlite3.Connection], T], *, retry: bool = True
    ) -> T:
        def once() -> T:
            with closing(sqlite3.connect(self.db, timeout=5, isolation_level=None)) as conn:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return result

        if not retry:
            return once()
        return retry_while_locked(
            once, db=self.db, doing=f"{doing} in MLflow store {self.target.describe()}",
            fix="other processes kept the store busy; try again", budget_s=BUDGET_S,
        )  # fmt: skip

    def create_scheduled(
        self, run_name: str, tags: Mapping[str, str], params: Mapping[str, str], user: str,
        created: list[str],
    ) -> tuple[str, str]:  # fmt: skip
        """A SCHEDULED run with its tags and params, in one transaction (made whole or
        not at all): (run id, artifact URI); its id is appended to `created`."""

        def create(conn: sqlite3.Connection) -> tuple[str, str]:
            location = _local_location(conn, self.experiment_id)
            if location is None:
                raise StokerError(f"MLflow experiment {self.experiment_id} is not usable here")
            run_id = uuid.uuid4().hex
            artifact_uri = f"{location.rstrip('/')}/{run_id}/artifacts"
            all_tags = {USER_TAG: user, **tags, RUN_NAME_TAG: run_name}
            conn.execute(
                "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, "
                "user_id, status, start_time, end_time, deleted_time, source_version, "
                "lifecycle_stage, artifact_uri, experiment_id) VALUES "
                "(?, ?, 'UNKNOWN', '', '', ?, 'SCHEDULED', ?, NULL, NULL, '', 'active', ?, ?)",
                (run_id, run_name, all_tags[USER_TAG], _now_ms(), artifact_uri,
                 int(self.experiment_id)),
            )  # fmt: skip
            conn.executemany(
                "INSERT INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                [(key, value, run_id) for key, value in all_tags.items()],
            )
            conn.executemany(
                "INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)",
                [(key, value, run_id) for key, value in params.items()],
            )
            return run_id, artifact_uri

        run_id, artifact_uri = self._write("create a run", create)
        created.append(run_id)
        return run_id, artifact_uri

    def log_texts(self, run_id: str, texts: Mapping[str, str]) -> None:
        """Each text as the artifact file of its (relative, checked) name."""
        if not texts:
            return
        folder = _artifact_folder(self._artifact_uri(run_id))
        for name, text in texts.items():
            path = folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        def write(conn: sqlite3.Connection) -> None:
            _active_run(conn, run_id, self.target)
            conn.executemany(
                "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                [(key, value, run_id) for key, value in tags.items()],
            )

        self._write(f"set tags of run {run_id}", write)

    def end(self, run_id: str, status: str) -> None:
        """Set the run's status and end time, as MlflowClient.set_terminated."""
        self._write(f"end run {run_id}", lambda conn: _end(conn, run_id, status, self.target))

    def abandon(self, run_id: str, tag: str, reason: str) -> None:
        """FAILED with `reason` in `tag`, in one attempt: no retries while locked (a
        sweep's 100 runs must not wait out the lock each)."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)",
                (tag, reason, run_id),
            )
            _end(conn, run_id, "FAILED", self.target)

        self._write(f"fail run {run_id}", write, retry=False)

    def _artifact_uri(self, run_id: str) -> str:
        with closing(sqlite3.connect(self.db, timeout=5)) as conn:
            row = conn.execute(
                "SELECT artifact_uri FROM runs WHERE run_uuid = ?", (run_id,)
            ).fetchone()
        if row is None:
            raise StokerError(f"MLflow store {self.target.describe()} has no run {run_id}")
        return str(row[0])


def _end(conn: sqlite3.Connection, run_id: str, status: str, target: TrackingTarget) -> None:
    _active_run(conn, run_id, target)
    conn.execute(
        "UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?",
        (status, _now_ms(), run_id),
    )


def _active_run(conn: sqlite3.Connection, run_id: str, target: TrackingTarget) -> None:
    row = conn.execute("SELECT lifecycle_stage FROM runs WHERE run_uuid = ?", (run_id,)).fetchone()
    if row is None:
        raise StokerError(f"MLflow store {target.describe()} has no run {run_id}")
    if row[0] != "active":
        raise StokerError(f"MLflow run {run_id} in {target.describe()} is deleted")


def _artifact_folder(uri: str) -> Path:
    return Path(uri.removeprefix("file://"))


def _is_local(location: str) -> bool:
    return location.startswith("/") or (
        location.startswith("file:///") and "?" not in location and "#" not in location
    )


def _local_location(conn: sqlite3.Connection, experiment_id: str) -> str | None:
    row = conn.execute(
        "SELECT artifact_location, lifecycle_stage FROM experiments WHERE experiment_id = ?",
        (int(experiment_id),),
    ).fetchone()
    if row is None or row[1] != "active" or not row[0] or not _is_local(str(row[0])):
        return None
    return str(row[0])


def open_direct(target: TrackingTarget, experiment: str | None) -> DirectRuns | None:
    """DirectRuns for `target` and the experiment named `experiment` (None: for runs that
    exist already), or None where MLflow must open the store (see the module's list)."""
    db = target.db_path
    if db is None or not db.is_file():
        return None
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as conn:
            revision = conn.execute("SELECT version_num FROM alembic_version").fetchone()
            if revision is None or revision[0] not in KNOWN_REVISIONS:
                return None
    except sqlite3.Error:  # locked, not a database, no such table: MLflow will say
        return None
    runs = DirectRuns(target, db, "")
    if experiment is None:
        return runs
    try:
        experiment_id = runs._write(
            f"find or create experiment {experiment!r}",
            lambda conn: _experiment_id(conn, target, experiment),
        )
    except sqlite3.Error:
        return None
    if experiment_id is None:
        return None
    runs.experiment_id = experiment_id
    return runs


def _experiment_id(conn: sqlite3.Connection, target: TrackingTarget, name: str) -> str | None:
    """The id of the active experiment `name` with a local artifact folder, created if
    missing (in the caller's write transaction: two submits cannot both create it);
    None for one MLflow must handle (deleted, artifacts elsewhere)."""
    find = "SELECT experiment_id FROM experiments WHERE name = ? AND workspace = ?"
    row = conn.execute(find, (name, DEFAULT_WORKSPACE)).fetchone()
    if row is None:
        if target.artifact_root is None:
            return None
        now = _now_ms()
        location = str(Path(target.artifact_root) / experiment_folder(name))
        created = conn.execute(
            "INSERT INTO experiments (name, artifact_location, lifecycle_stage, creation_time, "
            "last_update_time, workspace) VALUES (?, ?, 'active', ?, ?, ?)",
            (name, location, now, now, DEFAULT_WORKSPACE),
        )
        # The kind tag makes MLflow's UI open it in its model-training layout.
        conn.execute(
            "INSERT INTO experiment_tags (key, value, experiment_id) VALUES (?, ?, ?)",
            (EXPERIMENT_KIND_TAG, TRAINING_KIND, created.lastrowid),
        )
        return str(created.lastrowid)
    if _local_location(conn, str(row[0])) is None:
        return None
    return str(row[0])
