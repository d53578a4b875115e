"""pytest plugin: the ``slurm_cluster`` session fixture and the ``slurm`` marker.

Load it from tests/conftest.py with ``pytest_plugins = ["tests.cluster.fixtures"]``
(or ``-p tests.cluster.fixtures``).

Environment:
    STOKER_TEST_SLURM_DIR        state folder of the local cluster (default /tmp/stoker-slurm)
    STOKER_TEST_SLURM_BASE_PORT  first of its 5 ports (default 17100)
    STOKER_TEST_SLURM_KEEP=1     leave a cluster this session started running afterwards
    STOKER_TEST_SLURM_EXTERNAL=1 use the cluster that `sinfo` already talks to (a real one):
                                 nothing is installed, started or stopped
    STOKER_TEST_SLURM_PARTITION  partition of that external cluster (default: its default)
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from . import localslurm
from .localslurm import ClusterSettings


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slurm: needs the local SLURM cluster (tests/cluster)")


def _flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in {"1", "true", "yes"}


def _start_or_reuse() -> tuple[ClusterSettings, bool]:
    """The cluster to test against, and whether this call started it."""
    if _flag("STOKER_TEST_SLURM_EXTERNAL"):
        return localslurm.describe_external(os.environ.get("STOKER_TEST_SLURM_PARTITION")), False
    if localslurm.is_running():
        return localslurm.load_settings(), False
    localslurm.install()
    try:
        return localslurm.start(), True
    except localslurm.ClusterError:
        localslurm.stop()  # leave no half-started cluster behind; its logs stay
        raise


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[ClusterSettings]:
    """A running SLURM cluster; SLURM_CONF points at it for the whole session.

    Reuses a healthy local cluster (e.g. from `make cluster-up`) and leaves it
    running; otherwise installs and starts one and stops it at the end. Fails
    (never skips) when that is impossible, so a broken setup cannot pass unnoticed.
    """
    error = ""
    try:
        settings, started_here = _start_or_reuse()
    except localslurm.ClusterError as exc:
        error = str(exc)
    if error:  # failing outside the except block keeps the report to the message
        pytest.fail(f"SLURM cluster unavailable: {error}", pytrace=False)

    saved = {key: os.environ.get(key) for key in settings.env}
    os.environ.update(settings.env)
    try:
        yield settings
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if started_here and not _flag("STOKER_TEST_SLURM_KEEP"):
            localslurm.stop(settings.state_dir)
