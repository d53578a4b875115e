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
from stoker.kernels.cross_entropy_loss import (
    CrossEntropyLoss,
    cross_entropy,
    cross_entropy_reference,
)
from stoker.kernels.gated_units import GatedMLP, GeGLU, SwiGLU, geglu, glu, swiglu
from stoker.kernels.norms import (
    AdaLNRMSNorm,
    AddRMSNorm,
    RMSNorm,
    add_rms_norm,
    modulated_rms_norm,
    rms_norm,
)
from stoker.kernels.rope import (
    RoPE,
    apply_rope,
    rope_reference,
    rope_table_1d,
    rope_table_3d,
)

__all__ = [
    "BACKENDS",
    "AdaLNRMSNorm",
    "AddRMSNorm",
    "Backend",
    "CrossEntropyLoss",
    "GatedMLP",
    "GeGLU",
    "KernelBackendError",
    "RMSNorm",
    "RoPE",
    "SwiGLU",
    "add_rms_norm",
    "apply_rope",
    "cross_entropy",
    "cross_entropy_reference",
    "geglu",
    "get_backend",
    "glu",
    "modulated_rms_norm",
    "rms_norm",
    "rope_reference",
    "rope_table_1d",
    "rope_table_3d",
    "set_backend",
    "swiglu",
    "use_backend",
]
