"""The ledger: every job stoker submitted from this machine, in one sqlite file.

`<STOKER_HOME>/ledger.sqlite`. Many CLI calls may write at once (50 `stoker submit`
from a script, `status --watch` in another terminal): WAL mode lets readers go on
while one writes, a busy timeout makes each write wait for the others, and a call
that still meets "database is locked" is run again with backoff for up to 60 s
(stoker/sqlite_retry.py) before it fails with an error naming the file.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from stoker.errors import StokerError
from stoker.home import stoker_home
from stoker.sqlite_retry import BUDGET_S, retry_while_locked

T = TypeVar("T")
# What one attempt waits in sqlite's busy handler; retry_while_locked tries again after it.
BUSY_TIMEOUT_MS = 5000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id        TEXT PRIMARY KEY,   -- SLURM job id ("123"), or "local-<n>" for --local
    backend       TEXT NOT NULL,      -- "slurm" or "local"
    cluster       TEXT NOT NULL,      -- SLURM ClusterName, or the host for local jobs
    name          TEXT NOT NULL,
    run_dir       TEXT NOT NULL,
    config_hash   TEXT NOT NULL,
    template      TEXT NOT NULL,
    submitted_at  REAL NOT NULL,      -- epoch seconds
    mlflow_run_id TEXT,
    tracking_uri  TEXT,
    array_size    INTEGER,            -- tasks of a job array (sweep), else NULL
    restarts      INTEGER NOT NULL DEFAULT 0,
    final_state   TEXT,               -- set once the job has ended, so it is not queried again
    extra         TEXT NOT NULL DEFAULT '{}'  -- JSON: command, array task run ids, ...
);
CREATE INDEX IF NOT EXISTS jobs_by_time ON jobs (submitted_at);
"""

_COLUMNS = (
    "job_id",
    "backend",
    "cluster",
    "name",
    "run_dir",
    "config_hash",
    "template",
    "submitted_at",
    "mlflow_run_id",
    "tracking_uri",
    "array_size",
    "restarts",
    "final_state",
    "extra",
)
# The JobRecord field of each column where their names differ: the column `config_hash`
# keeps its first name (existing ledgers), the field says what it holds.
_FIELD_OF_COLUMN = {"config_hash": "config_digest"}
_FIELDS = tuple(_FIELD_OF_COLUMN.get(column, column) for column in _COLUMNS)


@dataclass
class JobRecord:
    """One submitted job as the ledger keeps it."""

    job_id: str
    backend: str
    cluster: str
    name: str
    run_dir: str
    config_digest: str
    """The frozen configs' SHA-256 (`frozen_config_digest`), in the column `config_hash`."""
    template: str
    submitted_at: float = field(default_factory=time.time)
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    array_size: int | None = None
    restarts: int = 0
    final_state: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def _row(self) -> tuple[Any, ...]:
        values = [getattr(self, name) for name in _FIELDS]
        values[-1] = json.dumps(self.extra, sort_keys=True)
        return tuple(values)

    @classmethod
    def _from_row(cls, row: Sequence[Any]) -> JobRecord:
        data = dict(zip(_FIELDS, row, strict=True))
        data["extra"] = json.loads(data["extra"] or "{}")
        return cls(**data)


def _json_path(keys: tuple[str, ...]) -> str:
    """`("reasons", "123_4")` -> `$."reasons"."123_4"` (quoted: "123_4" is no array index)."""
    for key in keys:
        if not key or '"' in key or "\\" in key:
            raise ValueError(f"{key!r} cannot be a key of the ledger's extra JSON")
    return "$" + "".join(f'."{key}"' for key in keys)


def ledger_path() -> Path:
    return stoker_home() / "ledger.sqlite"


class Ledger:
    """Read and write job records. Each method is one short transaction, retried while
    the file is locked by other processes (for `budget_s` in all)."""

    def __init__(self, path: Path | None = None, *, budget_s: float = BUDGET_S) -> None:
        self.path = path or ledger_path()
        self.budget_s = budget_s
        # At most a quarter of the budget in one wait, so that a small budget holds.
        self._busy_ms = int(min(BUSY_TIMEOUT_MS, budget_s * 250))

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self._busy_ms / 1000, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StokerError(
                f"cannot open the job ledger {self.path}: {exc}",
                fix="set STOKER_HOME to a writable folder",
            ) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.executescript(_SCHEMA)
            yield conn
        finally:
            conn.close()

    def _run(self, doing: str, body: Callable[[sqlite3.Connection], T], *, write: bool) -> T:
        """`body` on a fresh connection, in one IMMEDIATE transaction when it writes. The
        whole attempt (connect, schema, body) is retried while the file is locked."""

        def attempt() -> T:
            with self._connect() as conn:
                if not write:
                    return body(conn)
                conn.execute("BEGIN IMMEDIATE")
                try:
                    result = body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                return result

        return retry_while_locked(
            attempt,
            db=self.path,
            doing=doing,
            budget_s=self.budget_s,
            fix="other stoker commands kept it busy; try again. If it stays locked, "
            f"`fuser {self.path}` names the process that holds it",
        )

    def add(self, record: JobRecord) -> None:
        """Record a newly submitted job (replacing a stale record with the same id)."""
        placeholders = ", ".join("?" for _ in _COLUMNS)
        self._run(
            f"record job {record.job_id} in the job ledger",
            lambda conn: conn.execute(
                f"INSERT OR REPLACE INTO jobs ({', '.join(_COLUMNS)}) VALUES ({placeholders})",
                record._row(),
            ),
            write=True,
        )

    def get(self, job_id: str) -> JobRecord | None:
        row = self._run(
            f"read job {job_id} from the job ledger",
            lambda conn: conn.execute(
                f"SELECT {', '.join(_COLUMNS)} FROM jobs WHERE job_id = ?", (job_id,)
            ).fetchone(),
            write=False,
        )
        return JobRecord._from_row(row) if row else None

    def require(self, job_id: str) -> JobRecord:
        """The record of `job_id`, or an error that says how to find the right id."""
        record = self.get(job_id)
        if record is None:
            raise StokerError(
                f"job {job_id} is not in the ledger {self.path}",
                fix="`stoker status --all` lists the jobs stoker submitted from here",
            )
        return record

    def list(self, *, active_only: bool = False, limit: int | None = None) -> list[JobRecord]:
        """Newest first; `active_only` leaves out jobs already seen to end."""
        query = f"SELECT {', '.join(_COLUMNS)} FROM jobs"
        if active_only:
            query += " WHERE final_state IS NULL"
        query += " ORDER BY submitted_at DESC, job_id DESC"
        params: tuple[Any, ...] = ()
        if limit is not None:
            query += " LIMIT ?"
            params = (limit,)
        rows = self._run(
            "list the job ledger",
            lambda conn: conn.execute(query, params).fetchall(),
            write=False,
        )
        return [JobRecord._from_row(row) for row in rows]

    def update(
        self, job_id: str, *, restarts: int | None = None, final_state: str | None = None
    ) -> None:
        """Remember what a status query learned; `restarts` never goes down."""
        self.update_many({job_id: (restarts, final_state)})

    def update_many(self, changes: dict[str, tuple[int | None, str | None]]) -> None:
        """`{job_id: (restarts, final_state)}` in one transaction (one fsync, not one per job)."""
        if not changes:
            return

        def body(conn: sqlite3.Connection) -> None:
            for job_id, (restarts, final_state) in changes.items():
                if restarts is not None:
                    conn.execute(
                        "UPDATE jobs SET restarts = MAX(restarts, ?) WHERE job_id = ?",
                        (restarts, job_id),
                    )
                if final_state is not None:
                    conn.execute(
                        "UPDATE jobs SET final_state = ? WHERE job_id = ?",
                        (final_state, job_id),
                    )

        self._run(f"update {len(changes)} job(s) in the job ledger", body, write=True)

    def set_extra(self, changes: dict[str, dict[tuple[str, ...], Any]]) -> None:
        """`{job_id: {("reasons", "123_4"): "rank 1: ...", ...}}`: set values at these key
        paths of each job's `extra` JSON, in one transaction; other keys are kept."""
        if not any(changes.values()):
            return

        def body(conn: sqlite3.Connection) -> None:
            for job_id, values in changes.items():
                for path, value in values.items():
                    conn.execute(
                        "UPDATE jobs SET extra = json_set(extra, ?, json(?)) WHERE job_id = ?",
                        (_json_path(path), json.dumps(value), job_id),
                    )

        self._run(f"update {len(changes)} job(s) in the job ledger", body, write=True)

    def reopen(self, job_id: str) -> None:
        """Forget a cached final state, reasons and run time: the job was requeued and
        runs again."""
        self._run(
            f"reopen job {job_id} in the job ledger",
            lambda conn: conn.execute(
                "UPDATE jobs SET final_state = NULL, extra = json_remove(extra, '$.reasons', "
                "'$.causes', '$.accounts', '$.mlflow_ended', '$.elapsed') "
                "WHERE job_id = ?",
                (job_id,),
            ),
            write=True,
        )

    def remove(self, job_id: str) -> None:
        self._run(
            f"remove job {job_id} from the job ledger",
            lambda conn: conn.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,)),
            write=True,
        )

    def reserve_local_id(self) -> str:
        """A fresh `local-<n>` id for the local backend, held by a placeholder row.

        One IMMEDIATE transaction: two `submit --local` at once get different ids.
        `add` later replaces the placeholder with the full record.
        """

        def body(conn: sqlite3.Connection) -> str:
            rows = conn.execute("SELECT job_id FROM jobs WHERE backend = 'local'").fetchall()
            numbers = [int(r[0][6:]) for r in rows if r[0][6:].isdigit()]
            job_id = f"local-{max(numbers, default=0) + 1}"
            conn.execute(
                "INSERT INTO jobs (job_id, backend, cluster, name, run_dir, config_hash,"
                " template, submitted_at) VALUES (?, 'local', '', '', '', '', '', ?)",
                (job_id, time.time()),
            )
            return job_id

        return self._run("reserve a local job id in the job ledger", body, write=True)
