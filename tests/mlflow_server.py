"""pytest plugin: a real `mlflow server` over HTTP, shared by the tests that need one."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def free_port() -> int:
    """A port that binds now, below the kernel's ephemeral range, as `stoker run` draws
    its ranks' (a port from that range can be any process's outgoing connection by the
    time a server listens on it)."""
    from stoker.launcher.local.backend import rendezvous_port

    return rendezvous_port()


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a server started with start_new_session=True and its children; SIGKILL
    after 15 s."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 240) -> None:
    """Until `url`/health answers 200; AssertionError with the log if the process
    exits or the time runs out. A server starts in about 10 s on an idle 2-core VM; over
    60 s was seen beside a 2-node training job and the CPU burner."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args!r} exited:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}/health did not answer within {timeout} s")
        time.sleep(0.2)


@dataclass
class Server:
    url: str
    db_uri: str


# MLflow 3's server starts a job runner and 7 job processes by default, for features no
# test uses: with them a start took 43 s to healthy at load 7, without them 17 s.
NO_JOB_RUNNER = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`mlflow server` on a free port. `--artifacts-destination` (with artifact serving,
    on by default in MLflow 3) gives experiments `mlflow-artifacts:/` locations, so
    clients upload through the server as they would from a compute node."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    db_uri = f"sqlite:///{folder / 'mlflow.db'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["HOME"] = str(folder)
    env.update(NO_JOB_RUNNER)
    log = (folder / "server.log").open("w")
    command = f"{MLFLOW} server --backend-store-uri {db_uri} --host 127.0.0.1 --port {port}"
    command += f" --artifacts-destination {folder / 'artifacts'} --workers 1"
    proc = subprocess.Popen(
        shlex.split(command),
        cwd=folder,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: uvicorn runs as a child
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, folder / "server.log")
        yield Server(url=url, db_uri=db_uri)
    finally:
        stop_process_group(proc)
        log.close()


class RestartableServer:
    """`mlflow server` on a fixed port and sqlite file, so a test can stop it and start
    it again where the clients expect it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db_uri = f"sqlite:///{folder / 'mlflow.db'}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        env["HOME"] = str(self.folder)
        env.update(NO_JOB_RUNNER)
        command = (
            f"{MLFLOW} server --backend-store-uri {self.db_uri} --host 127.0.0.1 "
            f"--port {self.port} --artifacts-destination {self.folder / 'artifacts'} --workers 1"
        )
        with (self.folder / "server.log").open("a") as log:
            self.proc = subprocess.Popen(
                shlex.split(command),
                cwd=self.folder,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_healthy(self.url, self.proc, self.folder / "server.log")

    def stop(self) -> None:
        if self.proc is not None:
            stop_process_group(self.proc)
            self.proc = None


# Used by name by the runtime's and the tracking package's tests (none autouse).
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
