"""Fixtures of the runtime's tests (used by name, none autouse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.mlflow_server import RestartableServer


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread. The models' tests use small shapes, which one
    thread runs as fast as two on an idle 2-core machine, and 10x faster when
    other processes load it (measured: 0.06 s vs 0.6 s of CPU per tiny
    audio_ar step at load 11; OpenMP threads spin waiting for each other)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
