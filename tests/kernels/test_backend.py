"""The switch between Triton and the reference: how `auto` resolves, what
overrides what, and the errors when Triton cannot run."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from stoker import kernels
from stoker.kernels import backend


def test_auto_runs_the_reference_off_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STOKER_KERNELS", raising=False)
    assert backend.resolve(None, torch.zeros(1)) == "reference"
    assert backend.resolve("reference", torch.zeros(1)) == "reference"


def test_precedence_argument_block_setting_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_KERNELS", "reference")
    assert kernels.get_backend() == "reference"
    kernels.set_backend("triton")
    try:
        assert kernels.get_backend() == "triton"
        with kernels.use_backend("auto"):
            assert kernels.get_backend() == "auto"
            with kernels.use_backend("reference"):
                assert kernels.get_backend() == "reference"
            assert kernels.get_backend() == "auto"
        assert kernels.get_backend() == "triton"
        assert backend.resolve("reference", torch.zeros(1)) == "reference"
    finally:
        kernels.set_backend(None)
    assert kernels.get_backend() == "reference"


def test_bad_values_name_their_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOKER_KERNELS", "cuda")
    with pytest.raises(kernels.KernelBackendError, match="'cuda' from the environment variable"):
        kernels.rms_norm(torch.ones(2, 4))
    monkeypatch.delenv("STOKER_KERNELS")
    with pytest.raises(kernels.KernelBackendError, match="'fast' from backend="):
        kernels.rms_norm(torch.ones(2, 4), backend="fast")  # type: ignore[arg-type]


def test_triton_on_cpu_without_the_interpreter_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(kernels.KernelBackendError) as err:
        kernels.swiglu(torch.ones(2, 4), backend="triton")
    assert "needs CUDA tensors; this one is on cpu" in str(err.value)
    assert "TRITON_INTERPRET=1" in str(err.value) and "kernels=auto" in str(err.value)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_does_not_import_triton() -> None:
    """Triton loads on the first Triton call only: the reference path and
    `import stoker.kernels` work where triton is missing or broken."""
    result = _python(
        "import sys; import stoker.kernels; assert 'triton' not in sys.modules, 'imported'"
    )
    assert result.returncode == 0, result.stderr


def test_without_triton_auto_works_and_triton_is_a_clear_error() -> None:
    code = """
import sys
sys.modules["triton"] = None  # as if not installed
import torch
from stoker import kernels
x = torch.randn(3, 8)
print(float(kernels.rms_norm(x).pow(2).mean()))
try:
    kernels.rms_norm(x, backend="triton")
except kernels.KernelBackendError as exc:
    print("ERROR", exc)
"""
    result = _python(code)
    assert result.returncode == 0, result.stderr
    mean_square, error = result.stdout.split("\n", 1)
    assert float(mean_square) == pytest.approx(1.0, rel=1e-3)
    assert "triton package is not installed" in error and "pip install triton" in error
