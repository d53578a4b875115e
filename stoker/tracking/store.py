"""The MLflow store: which one a job is recorded in, and opening it from any process.

Where runs go, first match wins:

    tracking.uri in the experiment config
    $MLFLOW_TRACKING_URI
    sqlite:///<STOKER_HOME>/mlflow/mlflow.db, artifacts in <STOKER_HOME>/mlflow/artifacts

`tracking.uri: none` (NO_TRACKING) means no store at all: no MLflow run is made and
the job writes its records to a file in its run folder (stoker/tracking/file_logger.py).
Whoever can work without a store asks `tracking_off` first; `resolve_tracking_uri`
refuses "none", so that nothing opens a store by mistake.

Two stores are supported: a sqlite file (on a filesystem the compute nodes
share) and an `mlflow server` over http(s), which many concurrent jobs should
use. Many `stoker submit` at once on one sqlite file work: the first creates the
schema while the others wait (`<db>.lock`), and a call that meets "database is
locked" is retried with backoff for up to 60 s (stoker/sqlite_retry.py).

Paths are made absolute here: the job runs in another folder on another
node, and MLflow resolves a relative sqlite path (and the artifacts of an
experiment created without an explicit location) against the current folder
of whichever process opens the store.

mlflow is imported inside the functions that talk to a store: any `mlflow.*`
import runs `mlflow/__init__` (about 1 s here), and the sqlite store adds
SQLAlchemy and alembic (about 0.5 s).
"""

from __future__ import annotations

import fcntl
import functools
import os
import random
import re
import shlex
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stoker.errors import StokerError
from stoker.home import stoker_home
from stoker.redact import has_url_password, hide_url_passwords
from stoker.sqlite_retry import BUDGET_S, retry_while_locked

T = TypeVar("T")

# Seconds a `stoker submit` waits for another one that is creating the sqlite schema.
LOCK_TIMEOUT = 120.0
# Seconds a store call may spend waiting for a locked sqlite file, its retries together.
RETRY_BUDGET_S = BUDGET_S
# MLflow's experiment kind tag and the value of its model-training layout.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"
# Seconds the reachability probe of a server waits when MLFLOW_HTTP_REQUEST_TIMEOUT is unset.
PROBE_TIMEOUT = 10.0
# tracking.uri's value for "no MLflow": records go to <run dir>/metrics.jsonl only.
NO_TRACKING = "none"

_SOURCE_TEXT = {
    "tracking.uri": "tracking.uri in the experiment config",
    "MLFLOW_TRACKING_URI": "the environment variable MLFLOW_TRACKING_URI",
    "default": "stoker's default store in $STOKER_HOME",
}


@dataclass(frozen=True)
class TrackingTarget:
    """An MLflow store, resolved on the login node; pass `uri` to the job unchanged."""

    uri: str
    """Absolute `sqlite:////...` path or `http(s)://host[:port][/prefix]` without a trailing /."""
    artifact_root: str | None
    """Folder under which stoker puts new experiments' artifacts (sqlite); None for a
    server, which owns its artifact store."""
    source: str
    """Where the URI came from: "tracking.uri", "MLFLOW_TRACKING_URI" or "default"."""

    @property
    def is_server(self) -> bool:
        return self.uri.startswith(("http://", "https://"))

    @property
    def db_path(self) -> Path | None:
        """The sqlite file, or None for a server."""
        if self.is_server:
            return None
        return Path(self.uri.removeprefix("sqlite:///").split("?", 1)[0])

    def describe(self) -> str:
        """`URI (from WHERE)`, for messages."""
        return f"{self.uri} (from {_SOURCE_TEXT.get(self.source, self.source)})"


def default_target() -> TrackingTarget:
    """The embedded store: a sqlite file and an artifact folder in $STOKER_HOME."""
    folder = stoker_home() / "mlflow"
    return TrackingTarget(
        uri=f"sqlite:///{folder / 'mlflow.db'}",
        artifact_root=str(folder / "artifacts"),
        source="default",
    )


def tracking_off(config_uri: str | None) -> bool:
    """Whether tracking.uri is `none`: no MLflow store, records in the run folder."""
    return config_uri is not None and config_uri.strip().lower() == NO_TRACKING


def resolve_tracking_uri(config_uri: str | None) -> TrackingTarget:
    """The store this submit records into: config value, else $MLFLOW_TRACKING_URI, else
    the default. Relative sqlite paths are made absolute against the current folder.

    Raises StokerError for a scheme stoker cannot hand to a job (file store, in-memory
    sqlite, other databases), naming the value and where it came from, and for
    tracking.uri `none` (no store: ask `tracking_off` first).
    """
    if tracking_off(config_uri):
        raise StokerError(
            "tracking.uri is none: this experiment records to no MLflow store (its runs "
            "write <run folder>/metrics.jsonl instead)",
            fix="set tracking.uri to a store (sqlite:///PATH/mlflow.db or http://HOST:PORT), "
            "or null for the default one, to use MLflow",
        )
    if config_uri is not None and config_uri.strip():
        return _parse_uri(config_uri.strip(), "tracking.uri")
    env_uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if env_uri:
        return _parse_uri(env_uri, "MLFLOW_TRACKING_URI")
    return default_target()


def _where_to_change(source: str) -> str:
    if source == "tracking.uri":
        return "change tracking.uri in the experiment config (or a k=v override)"
    if source == "MLFLOW_TRACKING_URI":
        return "change or unset MLFLOW_TRACKING_URI"
    return "set tracking.uri in the experiment config"


def _parse_uri(value: str, source: str) -> TrackingTarget:
    where = _SOURCE_TEXT[source]
    if has_url_password(value):
        # The URI is written into the job script, the ledger and the run link.
        raise StokerError(
            f"MLflow tracking URI {hide_url_passwords(value)!r} from {where} holds a password",
            fix="drop user and password from the URI; export MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) instead and list them in "
            "job.pass_env",
        )
    scheme = value.split(":", 1)[0].lower() if re.match(r"^[A-Za-z][\w+.-]*:", value) else ""
    examples = "sqlite:////shared/mlflow/mlflow.db or http://mlflow-host:5000"
    if scheme in ("http", "https"):
        parts = urllib.parse.urlsplit(value)
        if not parts.netloc:
            raise StokerError(
                f"MLflow tracking URI {value!r} from {where} has no host",
                fix=f"write it as {scheme}://HOST:PORT; {_where_to_change(source)}",
            )
        return TrackingTarget(uri=value.rstrip("/"), artifact_root=None, source=source)
    if scheme == "sqlite":
        return _parse_sqlite(value, source)
    if scheme == "file" or (not scheme and ("/" in value or value.startswith((".", "~")))):
        folder = value.removeprefix("file://") or "./mlruns"
        raise StokerError(
            f"MLflow tracking URI {value!r} from {where} is a file store, which MLflow 3 "
            "has deprecated and refuses to open",
            fix=f"use a sqlite store, e.g. sqlite:///{Path(folder).absolute().parent}/mlflow.db, "
            f"or a server ({_where_to_change(source)}); to keep old runs: "
            f"`mlflow migrate-filestore --source {folder} --target sqlite:///PATH/mlflow.db`",
        )
    raise StokerError(
        f"MLflow tracking URI {value!r} from {where}: scheme {scheme or value!r} is not supported "
        "by stoker (supported: sqlite:///PATH and http(s)://HOST)",
        fix=f"run `mlflow server --backend-store-uri {value}` in front of that store and use "
        f"its http URL, or use e.g. {examples}; {_where_to_change(source)}",
    )


def _parse_sqlite(value: str, source: str) -> TrackingTarget:
    where = _SOURCE_TEXT[source]
    rest = value[len("sqlite:") :]
    path_text, _, query = rest.partition("?")
    if not path_text.startswith("///") or path_text[3:] in ("", ":memory:"):
        raise StokerError(
            f"MLflow tracking URI {value!r} from {where} is not a sqlite file the job can open "
            "(an in-memory or host-qualified sqlite URI)",
            fix="write sqlite:///relative/path.db or sqlite:////absolute/path.db; "
            + _where_to_change(source),
        )
    # sqlite:///x.db is relative to the current folder; the job runs elsewhere.
    path = Path(path_text[3:]).expanduser().absolute()
    uri = f"sqlite:///{path}" + (f"?{query}" if query else "")
    return TrackingTarget(uri=uri, artifact_root=str(path.parent / "artifacts"), source=source)


def experiment_folder(name: str) -> str:
    """A folder name for an experiment's artifacts (names may hold '/', spaces, ...)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "experiment"


def _store_fix(target: TrackingTarget, message: str) -> str:
    change = _where_to_change(target.source)
    if target.is_server:
        if "UNAUTHENTICATED" in message or "PERMISSION_DENIED" in message or " 401" in message:
            return (
                "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or "
                f"MLFLOW_TRACKING_TOKEN) for this server, or {change}"
            )
        return (
            f"check that an MLflow server answers at {target.uri} "
            f"(`curl {target.uri}/health`), or {change}"
        )
    db = target.db_path
    if "out-of-date database schema" in message:
        return f"back up {db}, then run `mlflow db upgrade {target.uri}`"
    if "not a database" in message or "malformed" in message:
        return f"{db} is not a usable MLflow sqlite store: move it away, or {change}"
    return f"check that {db} and its folder are writable, or {change}"


@contextmanager
def store_errors(target: TrackingTarget, doing: str) -> Iterator[None]:
    """Turn whatever MLflow, SQLAlchemy or requests raise into a StokerError naming the store."""
    try:
        yield
    except StokerError:
        raise
    except ImportError as exc:
        raise StokerError(
            f"cannot import mlflow to {doing}: {exc}",
            fix="install it in this environment: pip install 'mlflow>=3.5'",
        ) from exc
    except Exception as exc:
        # Deliberately broad: the store's layers raise MlflowException, SQLAlchemy,
        # requests and OS errors, and every one of them means "this store failed" here.
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        summary = lines[0] if len(lines[0]) <= 400 else lines[0][:400] + "..."
        raise StokerError(
            f"MLflow store {target.describe()}: could not {doing}: {summary}",
            fix=_store_fix(target, str(exc)),
        ) from exc


def _probe_server(target: TrackingTarget) -> None:
    """Fail in milliseconds, before importing mlflow, when nothing listens at a server URI.

    MLflow itself retries a refused connection for minutes by default. Any HTTP answer,
    even an error status, counts as reachable: MLflow's own calls then say what is wrong.
    """
    # Here, not at the top: ssl and urllib.request cost 20 ms, and only servers need them.
    import ssl
    import urllib.error
    import urllib.request

    try:
        timeout = float(os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT") or PROBE_TIMEOUT)
    except ValueError:
        timeout = PROBE_TIMEOUT
    try:
        with urllib.request.urlopen(f"{target.uri}/health", timeout=timeout):
            pass
    except urllib.error.HTTPError:
        return
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            return  # MLflow has its own TLS settings (MLFLOW_TRACKING_INSECURE_TLS, ...)
        raise StokerError(
            f"MLflow server {target.describe()} is unreachable: {exc.reason}",
            fix=_store_fix(target, ""),
        ) from exc
    except (OSError, ValueError) as exc:  # timeouts, resets, a malformed URL
        raise StokerError(
            f"MLflow server {target.describe()} is unreachable: {exc}",
            fix=_store_fix(target, ""),
        ) from exc


@functools.cache
def _schema_head() -> str | None:
    """The schema revision this MLflow writes (alembic head; 15 ms), None if unknown."""
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        return str(_get_latest_schema_revision())  # type: ignore[no-untyped-call]
    except Exception:  # a private function of MLflow: without it, always take the lock
        return None


def _schema_current(db: Path) -> bool:
    """Does `db` hold MLflow's complete, current schema? Read with plain sqlite3 (a
    millisecond), so that a store in use needs no lock. A store being created or migrated
    shows an older revision, or none, until the last migration is committed."""
    head = _schema_head()
    if head is None or not db.is_file():
        return False
    try:
        conn = sqlite3.connect(db, timeout=5)
        try:
            row = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:  # no such table yet, locked, not a database: MLflow will say
        return False
    return row is not None and row[0] == head


@contextmanager
def _sqlite_lock(target: TrackingTarget) -> Iterator[None]:
    """Serialise stoker processes that open a sqlite store whose schema is not current,
    over `<db>.lock`.

    MLflow creates a fresh store's schema with a series of migrations; two processes
    doing that at once both fail ("duplicate column name", "table _alembic_tmp_params
    already exists"; 50 submits on a fresh STOKER_HOME without this lock: 0 succeeded).
    The lock is held while the store is opened and the experiment looked up or created.
    A store whose schema is already current is opened without it (50 processes taking
    turns cost 55 s of waiting, and past 120 s failed); so is one that became current
    while this process waited for the lock.
    """
    db = target.db_path
    if db is None or _schema_current(db):
        yield
        return
    try:
        db.parent.mkdir(parents=True, exist_ok=True)
        handle = open(db.with_name(db.name + ".lock"), "a")  # noqa: SIM115 (held across yield)
    except OSError as exc:
        raise StokerError(
            f"MLflow store {target.describe()}: cannot create {db.parent} or its lock file: {exc}",
            fix=_store_fix(target, ""),
        ) from exc
    with handle:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StokerError(
                        f"MLflow store {target.describe()}: another process has held "
                        f"{handle.name} for {LOCK_TIMEOUT:.0f} s",
                        fix="wait for the other `stoker submit` to finish, or stop it",
                    ) from None
                time.sleep(random.uniform(0.02, 0.1))
        held = True
        try:
            if _schema_current(db):  # the process before us created it
                fcntl.flock(handle, fcntl.LOCK_UN)
                held = False
            yield
        finally:
            if held:
                fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """Hide MLflow's INFO lines ("Creating initial MLflow database tables...") from the CLI,
    and the traceback MLflow logs for every "database is locked" (retried here; any other
    store error is reported by `store_errors`)."""
    import logging

    quiet = {"mlflow": logging.WARNING, "alembic": logging.WARNING}
    quiet["mlflow.store.db.utils"] = logging.CRITICAL
    loggers = [logging.getLogger(name) for name in quiet]
    levels = [logger.level for logger in loggers]
    for logger, level in zip(loggers, quiet.values(), strict=True):
        logger.setLevel(level)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextmanager
def open_store(target: TrackingTarget, experiment: str | None) -> Iterator[tuple[Any, str]]:
    """An MlflowClient bound to `target` (never to MLflow's global URI) and the id of
    `experiment`, created if missing ("" when `experiment` is None)."""
    if target.is_server:
        _probe_server(target)
    with store_errors(target, "open the store"):
        # The lightest import that gives a client; it still runs mlflow/__init__.
        from mlflow.tracking import MlflowClient

        # After the import: importing mlflow resets its loggers' levels.
        with _quiet_mlflow(), _sqlite_lock(target):
            client = RetryingClient(
                _retry(target, "open the store", lambda: MlflowClient(tracking_uri=target.uri)),
                target,
            )
            experiment_id = "" if experiment is None else _experiment_id(client, target, experiment)
    with _quiet_mlflow():
        yield client, experiment_id


def _retry(target: TrackingTarget, doing: str, call: Callable[[], T]) -> T:
    """`call()`, retried while a sqlite store (or a server's) answers "database is locked"."""
    db = target.db_path
    fix = (
        "other processes (stoker submit/sweep, jobs logging to the same file) kept it busy; "
        "try again. For many concurrent jobs run an MLflow server and point tracking.uri "
        "(or MLFLOW_TRACKING_URI) at it: "
        f"`mlflow server --backend-store-uri {shlex.quote(target.uri)} --port 5000`"
    )
    if db is None:
        fix = f"the server's database stayed locked: check the server at {target.uri}"
    return retry_while_locked(
        call,
        db=db or target.uri,
        doing=f"{doing} in MLflow store {target.describe()}",
        fix=fix,
        budget_s=RETRY_BUDGET_S,
    )


class RetryingClient:
    """An MlflowClient whose every call is retried while the store is locked.

    Each MLflow call is one transaction, so a retried call never half-applies; those
    stoker makes are safe to repeat (tags and params with equal values, artifacts
    overwritten).
    """

    def __init__(self, client: Any, target: TrackingTarget) -> None:
        self.raw = client
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.raw, name)
        if not callable(method):
            return method

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return _retry(self._target, f"call {name}", lambda: method(*args, **kwargs))

        return call


def _experiment_id(client: Any, target: TrackingTarget, name: str) -> str:
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(name)
    if found is None:
        location = None
        if target.artifact_root is not None:
            location = str(Path(target.artifact_root) / experiment_folder(name))
        try:
            # The kind tag makes MLflow's UI open it in its model-training layout (runs,
            # metrics charts), not the GenAI one (traces, agent versions, an assistant).
            return str(
                client.create_experiment(
                    name, artifact_location=location, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND}
                )
            )
        except MlflowException as exc:
            # Another submit created it between our lookup and create (server stores).
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        raise StokerError(
            f"MLflow experiment {name!r} (id {found.experiment_id}) in {target.describe()} "
            "is deleted",
            fix=f"restore it: MLFLOW_TRACKING_URI={shlex.quote(target.uri)} mlflow experiments "
            f"restore --experiment-id {found.experiment_id}; or set tracking.experiment to "
            "another name",
        )
    return str(found.experiment_id)
