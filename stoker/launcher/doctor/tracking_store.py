"""`stoker doctor`'s MLflow store check: reach the store as a job would, a sqlite
file in a writable (and shared) folder, or an HTTP server that answers /health.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from stoker.errors import StokerError
from stoker.launcher.doctor.check import Finding
from stoker.launcher.doctor.storage import sharing_finding, writable_folder

if TYPE_CHECKING:
    from stoker.tracking.store import TrackingTarget

HTTP_TIMEOUT = 5.0


def check_tracking_store(target: TrackingTarget) -> Finding:
    """Reach the store as a job would: sqlite folder writable, or an HTTP server healthy."""
    # Doctor reads no experiment file: a tracking.uri can only come from the profile.
    if target.source == "tracking.uri":
        origin = f"{target.uri} (from the site profile's tracking_uri)"
    else:
        origin = target.describe()
    db = target.db_path
    if target.is_server:
        return check_http_store(target.uri, origin)
    if db is None:  # resolve_tracking_uri hands out sqlite or http(s) only
        raise StokerError(f"{origin}: neither a sqlite file nor a server")
    return check_sqlite_store(db, target.artifact_root, origin)


def check_sqlite_store(db: Path, artifact_root: str | None, origin: str) -> Finding:
    fix = "point tracking_uri (profile) or MLFLOW_TRACKING_URI at a writable folder"
    problem = writable_folder(db.parent)
    if problem is None and db.exists():
        try:
            with db.open("r+b"):
                pass  # opening for update checks permission without writing
        except OSError as exc:
            problem = f"cannot open {db} for writing: {exc.strerror}"
    if problem:
        return Finding("mlflow", "fail", f"{origin}: {problem}", fix)
    if artifact_root and "://" not in artifact_root:
        problem = writable_folder(Path(artifact_root))
        if problem:
            return Finding("mlflow", "fail", f"{origin}: artifact folder: {problem}", fix)
    state = "exists" if db.exists() else "created by the first submit"
    shared_fix = (
        "jobs log to this database from the compute nodes: put it on a shared file system "
        "(STOKER_HOME or tracking_uri), or run `mlflow server`; ignore this on a one-machine "
        "cluster"
    )
    return sharing_finding(
        "mlflow", db.parent, f"{origin}: folder writable, database {state}", shared_fix
    )


def check_http_store(uri: str, origin: str) -> Finding:
    health = uri.rstrip("/") + "/health"
    fix = (
        "start the server (`mlflow server --host 0.0.0.0 --port PORT --backend-store-uri ...`) "
        "or point tracking_uri (profile) / MLFLOW_TRACKING_URI at a running one"
    )
    try:
        with urllib.request.urlopen(health, timeout=HTTP_TIMEOUT) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return Finding(
                "mlflow",
                "warn",
                f"{origin}: {health} answered {exc.code} {exc.reason}",
                "set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN",
            )
        return Finding(
            "mlflow",
            "fail",
            f"{origin}: {health} answered {exc.code} {exc.reason}: is this an MLflow server?",
            fix,
        )
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            # MLflow verifies TLS with its own settings, which urllib does not read.
            return Finding(
                "mlflow",
                "warn",
                f"{origin}: TLS check of {health} failed here: {exc.reason}",
                "if MLflow itself connects (MLFLOW_TRACKING_SERVER_CERT_PATH, "
                "REQUESTS_CA_BUNDLE), ignore this; else fix the server's certificate",
            )
        return Finding("mlflow", "fail", f"{origin}: cannot reach {health}: {exc.reason}", fix)
    except OSError as exc:  # timeouts and resets after connecting
        return Finding("mlflow", "fail", f"{origin}: cannot reach {health}: {exc}", fix)
    return Finding("mlflow", "ok", f"{origin}: server healthy (GET /health: {status})")
