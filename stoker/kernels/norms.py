"""RMSNorm and its fused forms: residual add + RMSNorm, and RMSNorm with adaLN
modulation `norm(x) * (1 + scale) + shift` (DiT conditioning, per sample).

All three are one Triton kernel pair (stoker/kernels/ops/rms_norm.py) behind
one custom op pair, `stoker::rms_norm_fwd` / `stoker::rms_norm_bwd`. Each
public function has a pure-torch reference that is also the CPU path.
"""

from __future__ import annotations

import torch
from torch import nn

from stoker.kernels.backend import Backend, resolve
from stoker.kernels.dispatch import (
    apply_function,
    as_rows,
    compute_dtype,
    direct_call,
    needs_grad,
)

# --- reference ---------------------------------------------------------------


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    residual: torch.Tensor | None = None,
    scale: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) in pure torch: fp32 inside (fp64 for fp64), one rounding to x's
    dtype at the end, as the Triton kernel does. h = x + residual rounded to
    x's dtype (or x)."""
    h = x if residual is None else x + residual
    acc = compute_dtype(x.dtype)
    hf = h.to(acc)
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(acc)
    if scale is not None and shift is not None:
        y = y * (1 + _per_sample(scale, x).to(acc)) + _per_sample(shift, x).to(acc)
    return y.to(x.dtype), h


def _per_sample(mod: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[B, N] modulation as [B, 1, ..., 1, N], broadcasting over x's token dims."""
    return mod.reshape(mod.shape[0], *([1] * (x.dim() - 2)), mod.shape[-1])


# --- custom ops (what torch.compile sees) -------------------------------------


@torch.library.custom_op("stoker::rms_norm_fwd", mutates_args=())
def rms_norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton forward on [M, N] rows: (y, h or empty, rstd fp32 [M])."""
    from stoker.kernels.ops import rms_norm as ops

    return ops.rms_norm_fwd(x, residual, weight, scale, shift, eps)


@rms_norm_fwd.register_fake
def _rms_norm_fwd_fake(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m, n = x.shape
    h = x.new_empty((m, n) if residual is not None else (0,))
    return x.new_empty((m, n)), h, x.new_empty((m,), dtype=torch.float32)


@torch.library.custom_op("stoker::rms_norm_bwd", mutates_args=())
def rms_norm_bwd(
    dy: torch.Tensor,
    dh_out: torch.Tensor | None,
    h: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton backward: (dh, dweight, dscale, dshift); absent ones are empty."""
    from stoker.kernels.ops import rms_norm as ops

    dh, dw, dscale, dshift = ops.rms_norm_bwd(dy, dh_out, h, weight, scale, rstd)
    # A custom op's outputs may not alias each other: one empty tensor each.
    return (
        dh,
        h.new_empty(0) if dw is None else dw,
        h.new_empty(0) if dscale is None else dscale,
        h.new_empty(0) if dshift is None else dshift,
    )


@rms_norm_bwd.register_fake
def _rms_norm_bwd_fake(
    dy: torch.Tensor,
    dh_out: torch.Tensor | None,
    h: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return (
        h.new_empty(h.shape),
        h.new_empty(0) if weight is None else torch.empty_like(weight),
        h.new_empty(0) if scale is None else torch.empty_like(scale),
        h.new_empty(0) if scale is None else torch.empty_like(scale),
    )


# --- autograd ----------------------------------------------------------------


class RMSNormFunction(torch.autograd.Function):
    """Triton RMSNorm with optional residual add and modulation, on [M, N] rows.
    Returns (y, h); h is empty without a residual."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        weight: torch.Tensor | None,
        scale: torch.Tensor | None,
        shift: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fwd = ops_rms_norm_fwd if direct_call(x) else rms_norm_fwd
        y, h, rstd = fwd(x, residual, weight, scale, shift, eps)
        ctx.save_for_backward(x if residual is None else h, weight, scale, rstd)  # type: ignore[arg-type]
        ctx.has_residual = residual is not None  # type: ignore[attr-defined]
        ctx.has_shift = shift is not None  # type: ignore[attr-defined]
        if residual is None:
            ctx.mark_non_differentiable(h)
        return y, h

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dy: torch.Tensor, dh_out: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        h, weight, scale, rstd = ctx.saved_tensors  # type: ignore[attr-defined]
        has_residual: bool = ctx.has_residual  # type: ignore[attr-defined]
        dy = dy.contiguous()
        if dh_out is not None:
            dh_out = dh_out.contiguous() if has_residual else None
        bwd = ops_rms_norm_bwd if direct_call(dy) else rms_norm_bwd
        dh, dw, dscale, dshift = bwd(dy, dh_out, h, weight, scale, rstd)
        return (
            dh if needs_grad(ctx, 0) else None,
            dh if has_residual and needs_grad(ctx, 1) else None,
            dw if weight is not None and needs_grad(ctx, 2) else None,
            dscale if scale is not None and needs_grad(ctx, 3) else None,
            dshift if ctx.has_shift and needs_grad(ctx, 4) else None,  # type: ignore[attr-defined]
            None,
        )


def ops_rms_norm_fwd(
    *args: object,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The Triton forward without the custom-op dispatch (about 8 us a call
    measured on the CPU here): eager calls on plain tensors take this path."""
    from stoker.kernels.ops import rms_norm as ops

    return ops.rms_norm_fwd(*args)  # type: ignore[arg-type]


def ops_rms_norm_bwd(
    *args: object,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    from stoker.kernels.ops import rms_norm as ops

    return ops.rms_norm_bwd(*args)  # type: ignore[arg-type]


# --- public functions ----------------------------------------------------------


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    backend: Backend | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) * weight."""
    _check_last_dim("weight", weight, x)
    if resolve(backend, x) == "reference":
        return rms_norm_reference(x, weight, eps)[0]
    y: torch.Tensor = apply_function(RMSNormFunction, as_rows(x), None, weight, None, None, eps)[0]
    return y.view(x.shape)


def add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    backend: Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused residual add + RMSNorm: h = x + residual; returns (rms_norm(h), h).
    h is the residual stream the next block adds to."""
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"residual {tuple(residual.shape)} {residual.dtype} must match x "
            f"{tuple(x.shape)} {x.dtype}"
        )
    _check_last_dim("weight", weight, x)
    if resolve(backend, x) == "reference":
        return rms_norm_reference(x, weight, eps, residual=residual)
    y, h = apply_function(RMSNormFunction, as_rows(x), as_rows(residual), weight, None, None, eps)
    return y.view(x.shape), h.view(x.shape)


def modulated_rms_norm(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    backend: Backend | None = None,
) -> torch.Tensor:
    """adaLN: rms_norm(x) * (1 + scale) + shift. x: [B, ..., N]; scale, shift:
    [B, N] (or [B, 1, N]), one vector per sample, broadcast over its tokens."""
    scale, shift = _modulation(x, scale, shift)
    _check_last_dim("weight", weight, x)
    if resolve(backend, x) == "reference":
        return rms_norm_reference(x, weight, eps, scale=scale, shift=shift)[0]
    y: torch.Tensor = apply_function(RMSNormFunction, as_rows(x), None, weight, scale, shift, eps)[
        0
    ]
    return y.view(x.shape)


def _check_last_dim(name: str, t: torch.Tensor | None, x: torch.Tensor) -> None:
    if t is not None and (t.dim() != 1 or t.shape[0] != x.shape[-1]):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected ({x.shape[-1]},)")


def _modulation(
    x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """scale and shift as contiguous [B, N] (small: one row per sample), or a
    ValueError that names the shapes."""
    batch, n = x.shape[0], x.shape[-1]
    out = []
    for name, mod in (("scale", scale), ("shift", shift)):
        if mod.dim() == 3 and mod.shape[1] == 1:
            mod = mod[:, 0]
        if mod.dim() != 2 or mod.shape != (batch, n):
            raise ValueError(
                f"{name} has shape {tuple(mod.shape)}; adaLN takes one vector per sample: "
                f"({batch}, {n}) or ({batch}, 1, {n}) for x of shape {tuple(x.shape)}"
            )
        out.append(mod.contiguous())
    if out[0].dtype != out[1].dtype:
        raise ValueError(f"scale is {out[0].dtype} but shift is {out[1].dtype}; use one dtype")
    return out[0], out[1]


# --- modules -----------------------------------------------------------------


class RMSNorm(nn.Module):
    """RMSNorm with an optional learned per-channel weight."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        *,
        elementwise_affine: bool = True,
        backend: Backend | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.dim, self.eps, self.backend = dim, eps, backend
        self.weight = (
            nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
            if elementwise_affine
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, backend=self.backend)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, affine={self.weight is not None}"


class AddRMSNorm(RMSNorm):
    """Residual add fused with RMSNorm: forward(x, residual) -> (norm(h), h)."""

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return add_rms_norm(x, residual, self.weight, self.eps, backend=self.backend)


class AdaLNRMSNorm(RMSNorm):
    """adaLN: forward(x, scale, shift) = norm(x) * (1 + scale) + shift, with
    scale and shift per sample (from the timestep / conditioning embedding).
    No learned weight by default: (1 + scale) already scales each channel, as
    in DiT's LayerNorm(elementwise_affine=False)."""

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        *,
        elementwise_affine: bool = False,
        backend: Backend | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            dim,
            eps,
            elementwise_affine=elementwise_affine,
            backend=backend,
            device=device,
            dtype=dtype,
        )

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor
    ) -> torch.Tensor:
        return modulated_rms_norm(x, scale, shift, self.weight, self.eps, backend=self.backend)
