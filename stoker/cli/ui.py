"""`stoker ui`: the MLflow UI on the store stoker records into."""

from __future__ import annotations

import typer


def ui(
    port: int = typer.Option(5000, "--port", min=1, max=65535, help="Port to serve on."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    uri: str = typer.Option(
        None, "--uri", help="Tracking store (default: $MLFLOW_TRACKING_URI, else stoker's own)."
    ),
) -> None:
    """Start the MLflow UI on stoker's tracking store (Ctrl-C stops it).

    For an `mlflow server` store it prints its address instead: that server is the UI.

    Example: stoker ui --port 5001  (then open http://127.0.0.1:5001)
    """
    import os
    import shutil
    import sys

    from stoker.cli.output import note
    from stoker.errors import StokerError
    from stoker.tracking.store import resolve_tracking_uri

    target = resolve_tracking_uri(uri)
    if target.is_server:
        note(f"the store is an MLflow server: open {target.uri}")
        return
    mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or shutil.which("mlflow")
    if mlflow is None:
        raise StokerError("the `mlflow` command is not installed", fix="pip install mlflow")
    argv = [mlflow, "ui", "--backend-store-uri", target.uri, "--host", host, "--port", str(port)]
    if target.artifact_root:
        argv += ["--default-artifact-root", target.artifact_root]
    note(f"MLflow UI for {target.uri} on http://{host}:{port} (Ctrl-C stops it)")
    os.execv(mlflow, argv)
