"""pytest plugin: a real S3 API server on localhost (moto in server mode), and s3fs
pointed at it through the standard AWS_* variables, as a compute node would be."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.mlflow_server import free_port, stop_process_group

MOTO = str(Path(sys.executable).with_name("moto_server"))


@dataclass
class S3Server:
    endpoint: str
    env: dict[str, str]
    """AWS_* variables that make boto/s3fs (and child processes) use this server."""

    def new_bucket(self) -> str:
        """A fresh bucket: tests never see each other's objects."""
        import boto3

        name = f"t-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1").create_bucket(
            Bucket=name
        )
        return name


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    folder = tmp_path_factory.mktemp("s3-server")
    port = free_port()
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(
        [MOTO, "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"moto_server exited:\n{(folder / 'server.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("moto_server did not answer within 60 s")
            time.sleep(0.2)
        yield S3Server(
            endpoint=endpoint,
            env={
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
            },
        )
    finally:
        stop_process_group(proc)
        log.close()


@pytest.fixture
def s3_env(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server, with this test's environment (and its children's) pointed at it."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    # s3fs caches filesystem instances by their arguments: drop ones made before.
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    return s3_server
