"""Triton kernels, each with a pure-torch reference; knows nothing of the runtime.

Every kernel has: a reference in pure torch (also the CPU path), a Triton
forward and backward (stoker/kernels/ops/, imported on first use), a
`torch.library.custom_op` pair with fake implementations so that
`torch.compile(fullgraph=True)` traces through it, an `autograd.Function`, a
function and an `nn.Module`. `backend=` / `use_backend` / STOKER_KERNELS
choose `triton`, `reference` or `auto` (see stoker/kernels/backend.py).
"""

from stoker.kernels.backend import (
    BACKENDS,
    Backend,
    KernelBackendError,
    get_backend,
    set_backend,
    use_backend,
)
from stoker.kernels.norms import (
    AdaLNRMSNorm,
    AddRMSNorm,
    RMSNorm,
    add_rms_norm,
    modulated_rms_norm,
    rms_norm,
)

__all__ = [
    "BACKENDS",
    "AdaLNRMSNorm",
    "AddRMSNorm",
    "Backend",
    "KernelBackendError",
    "RMSNorm",
    "add_rms_norm",
    "get_backend",
    "modulated_rms_norm",
    "rms_norm",
    "set_backend",
    "use_backend",
]
