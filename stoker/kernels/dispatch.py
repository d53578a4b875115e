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
    if rows_view_exists(x):
        return x.view(-1, x.shape[-1])
    return x.reshape(-1, x.shape[-1]).contiguous()


def rows_view_exists(x: torch.Tensor) -> bool:
    """Whether the leading dims of `x` flatten into one without a copy: each one's
    stride is the next one's stride times its size (dims of size 1 aside). Decided
    from the strides, not by trying `view`: under torch.compile a failed view is an
    exception dynamo cannot trace (q and k unbound from one qkv tensor, the 1b
    av_dit compiled with the kernels on an H200, 2026-11-27)."""
    expected = None
    for size, stride in reversed(list(zip(x.shape[:-1], x.stride()[:-1], strict=True))):
        if size == 1:
            continue
        if expected is not None and stride != expected:
            return False
        expected = stride * size
    return True


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the references compute in: fp32 for the 16-bit types, as the
    kernels do, and fp64 for fp64 (the tests' exact reference)."""
    return torch.promote_types(dtype, torch.float32)


def apply_function(fn: type[torch.autograd.Function], *args: object) -> Any:
    """`fn.apply(*args)`; torch leaves `apply` untyped."""
    return fn.apply(*args)  # type: ignore[no-untyped-call]
