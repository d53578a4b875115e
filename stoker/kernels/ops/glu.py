"""Gated linear units, forward and backward, in Triton: y = act(a) * b on a
packed [M, 2H] input (a = gate, the first half; b = up, the second half), as
one projection to 2H produces it.

Packing is what makes the backward cheap: dx is one [M, 2H] tensor written
once, where two separate gradients would need a concatenation (one more full
read and write) to reach the fused projection.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stoker.kernels.ops.launch import warps_for

ACTIVATIONS = {"silu": 0, "gelu": 1, "gelu_tanh": 2}
# Globals a @triton.jit body reads must be constexpr (the GPU compiler refuses
# plain floats; the interpreter does not check).
_SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
_INV_SQRT_2 = tl.constexpr(0.7071067811865476)
_INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
# Columns per program: 1024 elements of a and of b (4 KiB in bf16 each).
_BLOCK = 1024


@triton.jit
def _act_and_grad(a, ACT: tl.constexpr):
    """act(a) and act'(a) in fp32."""
    if ACT == 0:
        sig = tl.sigmoid(a)
        return a * sig, sig * (1.0 + a * (1.0 - sig))
    elif ACT == 1:
        cdf = 0.5 * (1.0 + tl.erf(a * _INV_SQRT_2))
        return a * cdf, cdf + a * _INV_SQRT_2PI * tl.exp(-0.5 * a * a)
    else:
        # 0.5 (1 + tanh(u)) = sigmoid(2u) and 1 - tanh(u)^2 = 4 sigmoid(2u) sigmoid(-2u):
        # no tanh from libdevice, and no 1 - t*t, which cancels where |u| is large (fp32
        # grad x was 5x eager's error on an H200, 2026-11-27; the interpreter hid it).
        inner = _SQRT_2_OVER_PI * (a + 0.044715 * a * a * a)
        up = tl.sigmoid(2.0 * inner)
        down = tl.sigmoid(-2.0 * inner)
        dinner = _SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * a * a)
        return a * up, up + 2.0 * a * up * down * dinner


@triton.jit
def _glu_fwd(X, stride_x, Y, H, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    a = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(X + row * stride_x + H + cols, mask=ok, other=0.0).to(tl.float32)
    act, _ = _act_and_grad(a, ACT)
    tl.store(Y + row * H + cols, (act * b).to(Y.dtype.element_ty), mask=ok)


@triton.jit
def _glu_bwd(DY, stride_dy, X, stride_x, DX, H, ACT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < H
    dy = tl.load(DY + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
    a = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    b = tl.load(X + row * stride_x + H + cols, mask=ok, other=0.0).to(tl.float32)
    act, dact = _act_and_grad(a, ACT)
    dx = DX + row * 2 * H + cols
    tl.store(dx, (dy * b * dact).to(DX.dtype.element_ty), mask=ok)
    tl.store(dx + H, (dy * act).to(DX.dtype.element_ty), mask=ok)


def _block(h: int) -> int:
    return min(_BLOCK, triton.next_power_of_2(h))


def glu_fwd(x: torch.Tensor, activation: str) -> torch.Tensor:
    """x: [M, 2H] with unit column stride. Returns act(x[:, :H]) * x[:, H:]."""
    m, h = x.shape[0], x.shape[1] // 2
    y = torch.empty((m, h), dtype=x.dtype, device=x.device)
    if m and h:
        block = _block(h)
        _glu_fwd[(m, triton.cdiv(h, block))](
            x,
            x.stride(0),
            y,
            h,
            ACT=ACTIVATIONS[activation],
            BLOCK=block,
            num_warps=warps_for(block),
        )
    return y


def glu_bwd(dy: torch.Tensor, x: torch.Tensor, activation: str) -> torch.Tensor:
    """dy: [M, H], x: [M, 2H], both unit column stride. Returns dx [M, 2H]."""
    m, h = dy.shape
    dx = torch.empty((m, 2 * h), dtype=x.dtype, device=x.device)
    if m and h:
        block = _block(h)
        _glu_bwd[(m, triton.cdiv(h, block))](
            dy,
            dy.stride(0),
            x,
            x.stride(0),
            dx,
            h,
            ACT=ACTIVATIONS[activation],
            BLOCK=block,
            num_warps=warps_for(block),
        )
    return dx
