"""The caller's environment, carried to worker processes that come from a fork server.

A 'forkserver' worker is forked from a server process that started once, with the
environment of that moment; `os.environ` changed since (credentials exported by a
notebook cell, a test's endpoint, `AWS_PROFILE` switched between two loaders) would
not reach it, and the worker's S3 client would find no credentials or the wrong ones.
'spawn' and 'fork' hand over the environment at the time the worker starts; these make
a fork-server worker see the same."""

from __future__ import annotations

import os
from collections.abc import Mapping


def environment_now() -> dict[str, str]:
    """A copy of this process's environment, to hand to `adopt_environment` in a worker."""
    return dict(os.environ)


def adopt_environment(environment: Mapping[str, str]) -> None:
    """Make this process's environment exactly `environment` (a worker's first step)."""
    if dict(os.environ) == dict(environment):
        return
    os.environ.clear()
    os.environ.update(environment)
