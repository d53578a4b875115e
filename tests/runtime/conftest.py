"""Fixtures of the runtime's tests (used by name, none autouse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mlflow_server import RestartableServer


@pytest.fixture(scope="module")
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestartableServer]:
    """A real `mlflow server`, one per test module (stop/start it to make outages)."""
    instance = RestartableServer(tmp_path_factory.mktemp(f"{request.module.__name__}-server"))
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


@pytest.fixture
def mlflow_http_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """RunLogger.start() sets MLflow's HTTP retry defaults in os.environ: undo that after
    each test (set-then-delete makes monkeypatch restore "unset")."""
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
