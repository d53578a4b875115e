"""Which implementation a kernel call runs: `triton`, `reference` or `auto`.

`auto` (the default) runs Triton on CUDA tensors and the pure-torch reference
everywhere else. `triton` forces the Triton kernels: on CUDA, or on CPU tensors
in the Triton interpreter (`TRITON_INTERPRET=1`, slow, for tests). `reference`
forces pure torch, for debugging a numerical difference or a device Triton does
not support.

The choice is, in order: the `backend=` argument of a call or module, the
innermost `use_backend(...)` block, `set_backend(...)`, the `STOKER_KERNELS`
environment variable, then `auto`. The runtime sets it from `model.kernels`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator
from typing import Literal, TypeGuard

import torch

Backend = Literal["auto", "triton", "reference"]
Resolved = Literal["triton", "reference"]
BACKENDS: tuple[Backend, ...] = ("auto", "triton", "reference")
ENV_VAR = "STOKER_KERNELS"

_chosen: Backend | None = None


class KernelBackendError(ValueError):
    """A backend was asked for that cannot run here: what is wrong and the fix.

    Not a StokerError: the kernels import nothing of stoker outside stoker.kernels,
    so that they stand alone. The runtime and the bench commands report it as one.
    """

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


def _is_backend(value: str) -> TypeGuard[Backend]:
    return value in BACKENDS


def check_backend(value: str, where: str) -> Backend:
    """`value` as a Backend, or an error that names it and where it came from."""
    if not _is_backend(value):
        raise KernelBackendError(
            f"kernel backend {value!r} from {where} is not one of {', '.join(BACKENDS)}",
            fix=f"set {where} to auto, triton or reference",
        )
    return value


def set_backend(backend: Backend | None) -> None:
    """Choose the process-wide backend; None goes back to STOKER_KERNELS / auto."""
    global _chosen
    _chosen = None if backend is None else check_backend(backend, "set_backend()")


def get_backend() -> Backend:
    """The backend a call without `backend=` uses now (not yet resolved for a device)."""
    if _chosen is not None:
        return _chosen
    env = os.environ.get(ENV_VAR)
    if env:
        return check_backend(env, f"the environment variable {ENV_VAR}")
    return "auto"


@contextlib.contextmanager
def use_backend(backend: Backend) -> Iterator[None]:
    """Run the block with `backend`, then restore the previous choice."""
    global _chosen
    previous = _chosen
    _chosen = check_backend(backend, "use_backend()")
    try:
        yield
    finally:
        _chosen = previous


def _find_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # sys.modules["triton"] = None blocks it
        return False


# Looked up once (about 1 ms), not per call: resolve() runs inside traced code.
_TRITON_INSTALLED = _find_triton()


def triton_installed() -> bool:
    return _TRITON_INSTALLED


def triton_interpreted() -> bool:
    """True when Triton kernels run on the CPU in the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve(backend: Backend | None, tensor: torch.Tensor) -> Resolved:
    """The implementation a call on `tensor` runs, or an error saying why Triton cannot."""
    choice = get_backend() if backend is None else check_backend(backend, "backend=")
    if choice == "reference":
        return "reference"
    on_cuda = tensor.device.type == "cuda"
    if choice == "auto":
        return "triton" if on_cuda and triton_installed() else "reference"
    if not triton_installed():
        raise KernelBackendError(
            "kernel backend 'triton' was asked for but the triton package is not installed",
            fix="pip install triton (CUDA builds of torch bring it), or use kernels=auto",
        )
    if not on_cuda and not triton_interpreted():
        raise KernelBackendError(
            f"kernel backend 'triton' needs CUDA tensors; this one is on {tensor.device}",
            fix="use kernels=auto or reference on this device, or set TRITON_INTERPRET=1 "
            "to run the kernels in Triton's (slow) CPU interpreter",
        )
    return "triton"
