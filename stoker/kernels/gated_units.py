"""Gated linear units for the transformer MLP: SwiGLU `silu(a) * b` and GeGLU
`gelu(a) * b`, on a packed [..., 2H] input (gate first, then up), and the MLP
modules built on them.

One Triton kernel pair (stoker/kernels/ops/glu.py) behind one custom op pair,
`stoker::glu_fwd` / `stoker::glu_bwd`; the activation is an argument.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from stoker.kernels.backend import Backend, resolve
from stoker.kernels.dispatch import apply_function, as_rows, compute_dtype, direct_call

Activation = Literal["silu", "gelu", "gelu_tanh"]
ACTIVATIONS: tuple[Activation, ...] = ("silu", "gelu", "gelu_tanh")


def glu_reference(x: torch.Tensor, activation: Activation = "silu") -> torch.Tensor:
    """act(gate) * up in pure torch, fp32 inside (fp64 for fp64), one rounding."""
    gate, up = x.to(compute_dtype(x.dtype)).chunk(2, dim=-1)
    if activation == "silu":
        act = F.silu(gate)
    else:
        act = F.gelu(gate, approximate="tanh" if activation == "gelu_tanh" else "none")
    return (act * up).to(x.dtype)


@torch.library.custom_op("stoker::glu_fwd", mutates_args=())
def glu_fwd(x: torch.Tensor, activation: str) -> torch.Tensor:
    """Triton forward on packed [M, 2H] rows: [M, H]."""
    from stoker.kernels.ops import glu as ops

    return ops.glu_fwd(x, activation)


@glu_fwd.register_fake
def _glu_fwd_fake(x: torch.Tensor, activation: str) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] // 2))


@torch.library.custom_op("stoker::glu_bwd", mutates_args=())
def glu_bwd(dy: torch.Tensor, x: torch.Tensor, activation: str) -> torch.Tensor:
    """Triton backward: d(packed input) [M, 2H], gate gradient first."""
    from stoker.kernels.ops import glu as ops

    return ops.glu_bwd(dy, x, activation)


@glu_bwd.register_fake
def _glu_bwd_fake(dy: torch.Tensor, x: torch.Tensor, activation: str) -> torch.Tensor:
    return x.new_empty((dy.shape[0], 2 * dy.shape[1]))


def _ops_fwd(x: torch.Tensor, activation: str) -> torch.Tensor:
    from stoker.kernels.ops import glu as ops

    return ops.glu_fwd(x, activation)


def _ops_bwd(dy: torch.Tensor, x: torch.Tensor, activation: str) -> torch.Tensor:
    from stoker.kernels.ops import glu as ops

    return ops.glu_bwd(dy, x, activation)


class GLUFunction(torch.autograd.Function):
    """Triton act(gate) * up on packed [M, 2H] rows."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, activation: str
    ) -> torch.Tensor:
        ctx.save_for_backward(x)
        ctx.activation = activation  # type: ignore[attr-defined]
        return (_ops_fwd if direct_call(x) else glu_fwd)(x, activation)

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dy: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        dy = as_rows(dy)
        bwd = _ops_bwd if direct_call(dy) else glu_bwd
        return bwd(dy, x, ctx.activation), None  # type: ignore[attr-defined]


def glu(
    x: torch.Tensor, activation: Activation = "silu", *, backend: Backend | None = None
) -> torch.Tensor:
    """act(x[..., :H]) * x[..., H:] for x of last dim 2H."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not one of {', '.join(ACTIVATIONS)}")
    if x.shape[-1] % 2:
        raise ValueError(
            f"a gated unit takes a packed [..., 2H] input (gate, then up); the last dim of "
            f"{tuple(x.shape)} is odd"
        )
    if resolve(backend, x) == "reference":
        return glu_reference(x, activation)
    y: torch.Tensor = apply_function(GLUFunction, as_rows(x), activation)
    return y.view(*x.shape[:-1], x.shape[-1] // 2)


def swiglu(x: torch.Tensor, *, backend: Backend | None = None) -> torch.Tensor:
    """silu(gate) * up on packed [..., 2H] input."""
    return glu(x, "silu", backend=backend)


def geglu(
    x: torch.Tensor,
    approximate: Literal["none", "tanh"] = "none",
    *,
    backend: Backend | None = None,
) -> torch.Tensor:
    """gelu(gate) * up on packed [..., 2H] input; approximate as in F.gelu."""
    return glu(x, "gelu_tanh" if approximate == "tanh" else "gelu", backend=backend)


class GatedMLP(nn.Module):
    """The transformer MLP: w_out(act(gate) * up) with [gate, up] = w_in(x), one
    projection to 2 * hidden so the gated unit reads (and its gradient writes)
    one packed tensor."""

    def __init__(
        self,
        dim: int,
        hidden: int,
        activation: Activation = "silu",
        *,
        bias: bool = False,
        backend: Backend | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.activation, self.backend = activation, backend
        self.w_in = nn.Linear(dim, 2 * hidden, bias=bias, device=device, dtype=dtype)
        self.w_out = nn.Linear(hidden, dim, bias=bias, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.w_out(glu(self.w_in(x), self.activation, backend=self.backend))
        return y


class SwiGLU(GatedMLP):
    """MLP with SwiGLU (LLaMA, DiT variants): w_out(silu(gate) * up)."""

    def __init__(self, dim: int, hidden: int, **kwargs: object) -> None:
        super().__init__(dim, hidden, "silu", **kwargs)  # type: ignore[arg-type]


class GeGLU(GatedMLP):
    """MLP with GeGLU: w_out(gelu(gate) * up); approximate="tanh" for the tanh GELU."""

    def __init__(
        self, dim: int, hidden: int, approximate: Literal["none", "tanh"] = "none", **kwargs: object
    ) -> None:
        act: Activation = "gelu_tanh" if approximate == "tanh" else "gelu"
        super().__init__(dim, hidden, act, **kwargs)  # type: ignore[arg-type]
