"""Kernel tests run the Triton kernels on the GPU when one is present, else in
Triton's CPU interpreter. TRITON_INTERPRET must be set before the first
`@triton.jit` runs (stoker.kernels.ops is imported lazily, on first use)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.kernels.numerics import ON_GPU

if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if ON_GPU else "cpu")
