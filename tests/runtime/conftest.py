"""Fixtures of the runtime's tests (used by name, none autouse)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


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
