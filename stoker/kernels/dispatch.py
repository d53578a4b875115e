"""How a public kernel function reaches its Triton launcher, and the tensor
plumbing every kernel shares. Imports no triton."""

from __future__ import annotations

from typing import Any

import torch

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def direct_call(t: torch.Tensor) -> bool:
    """Launch the Triton kernel directly instead of through its custom op.

    The custom-op dispatch costs about 8 us a call (measured on the CPU here),
    as much as a whole norm at hidden 1024 on an H100. Eager calls on plain
    tensors skip it; torch.compile, export and tensor subclasses (fake,
    functional, DTensor) need the op and its fake implementation."""
    return not torch.compiler.is_compiling() and type(t) in _PLAIN


def needs_grad(ctx: torch.autograd.function.FunctionCtx, index: int) -> bool:
    return bool(ctx.needs_input_grad[index])  # type: ignore[attr-defined]


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` as a 2-D [rows, last dim] view with unit column stride; copies only
    when no such view exists (a transposed last dim, a strided middle dim)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    if x.dim() == 2:
        return x
    try:
        return x.view(-1, x.shape[-1])
    except (RuntimeError, ValueError):  # fake tensors (a plan's trace) raise ValueError
        return x.reshape(-1, x.shape[-1]).contiguous()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the references compute in: fp32 for the 16-bit types, as the
    kernels do, and fp64 for fp64 (the tests' exact reference)."""
    return torch.promote_types(dtype, torch.float32)


def apply_function(fn: type[torch.autograd.Function], *args: object) -> Any:
    """`fn.apply(*args)`; torch leaves `apply` untyped."""
    return fn.apply(*args)  # type: ignore[no-untyped-call]
