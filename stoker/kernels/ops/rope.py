"""Rotary position embedding for q and k in one launch, forward and backward,
in Triton.

Half-split pairs (GPT-NeoX / LLaMA-HF `rotate_half`): channel i pairs with
i + D/2. Per token, with c = cos[s, i], n = sin[s, i] (fp32 inside, one
rounding at the end):
    out_i       = x_i * c - x_{i+D/2} * n
    out_{i+D/2} = x_{i+D/2} * c + x_i * n
The backward is the rotation by -angle: the same kernel with n negated.

One program per (batch, position) token: it loads that position's cos/sin row
once and rotates every head of q and then of k with it, so q and k are read
once and written once, the byte model's minimum (the tables are [S, D/2],
shared over batch and heads, and stay in L2). q and k are read through their
batch / sequence / head strides: views split out of a fused qkv projection
are not copied.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stoker.kernels.ops.launch import warps_for

# Elements of one half tile (heads x D/2) a program holds per step; the q and
# k of a 16-head, 128-dim layer are one step each.
_MAX_TILE = 4096


@triton.jit
def _rotate_heads(
    X,
    stride_h,
    OUT,
    heads,
    cos,
    sin,
    cols,
    col_ok,
    HALF,
    BLOCK_H: tl.constexpr,
):
    """Rotate the `heads` rows of one token: X and OUT point at its head 0."""
    for start in range(0, heads, BLOCK_H):
        h = start + tl.arange(0, BLOCK_H)
        mask = (h < heads)[:, None] & col_ok[None, :]
        # int64: a head stride of a [B, H, S, D] view is S * D, times H it can pass 2^31.
        x_lo = X + h[:, None].to(tl.int64) * stride_h + cols[None, :]
        x1 = tl.load(x_lo, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_lo + HALF, mask=mask, other=0.0).to(tl.float32)
        out1 = x1 * cos[None, :] - x2 * sin[None, :]
        out2 = x2 * cos[None, :] + x1 * sin[None, :]
        o_lo = OUT + h[:, None] * (2 * HALF) + cols[None, :]
        tl.store(o_lo, out1.to(OUT.dtype.element_ty), mask=mask)
        tl.store(o_lo + HALF, out2.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _rope(
    Q,
    stride_qb,
    stride_qs,
    stride_qh,
    K,
    stride_kb,
    stride_ks,
    stride_kh,
    COS,
    stride_cs,
    SIN,
    stride_ss,
    QO,
    KO,
    S,
    HQ,
    HK,
    HALF,
    BACKWARD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    b = token // S
    s = token % S
    cols = tl.arange(0, BLOCK_HALF)
    col_ok = cols < HALF
    cos = tl.load(COS + s * stride_cs + cols, mask=col_ok, other=0.0).to(tl.float32)
    sin = tl.load(SIN + s * stride_ss + cols, mask=col_ok, other=0.0).to(tl.float32)
    if BACKWARD:
        # The rotation is orthogonal: its transpose, the gradient map, is the
        # rotation by -angle.
        sin = -sin
    _rotate_heads(
        Q + b * stride_qb + s * stride_qs,
        stride_qh,
        QO + token * HQ * (2 * HALF),
        HQ,
        cos,
        sin,
        cols,
        col_ok,
        HALF,
        BLOCK_H,
    )
    _rotate_heads(
        K + b * stride_kb + s * stride_ks,
        stride_kh,
        KO + token * HK * (2 * HALF),
        HK,
        cos,
        sin,
        cols,
        col_ok,
        HALF,
        BLOCK_H,
    )


def _unit_last(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim is unit-stride (any b, s, h strides), else a copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def _launch(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, backward: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, cos, sin = _unit_last(q), _unit_last(k), _unit_last(cos), _unit_last(sin)
    batch, seq, hq, dim = q.shape
    hk = k.shape[2]
    q_out = torch.empty((batch, seq, hq, dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((batch, seq, hk, dim), dtype=k.dtype, device=k.device)
    if batch * seq == 0 or dim == 0:
        return q_out, k_out
    half = dim // 2
    block_half = triton.next_power_of_2(half)
    block_h = max(1, min(triton.next_power_of_2(max(hq, hk)), _MAX_TILE // block_half))
    _rope[(batch * seq,)](
        q,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k,
        k.stride(0),
        k.stride(1),
        k.stride(2),
        cos,
        cos.stride(0),
        sin,
        sin.stride(0),
        q_out,
        k_out,
        seq,
        hq,
        hk,
        half,
        BACKWARD=backward,
        BLOCK_H=block_h,
        BLOCK_HALF=block_half,
        num_warps=warps_for(2 * block_h * block_half),
    )
    return q_out, k_out


def rope_fwd(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, S, Hq, D], k: [B, S, Hk, D], any b / s / h strides (a last dim
    that is not unit-stride is copied); cos, sin: [S, D/2]. Returns the rotated
    q and k, contiguous, in their dtype."""
    return _launch(q, k, cos, sin, backward=False)


def rope_bwd(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients of q and k from those of the rotated q and k: the
    rotation by -angle. Same layouts as rope_fwd."""
    return _launch(dq, dk, cos, sin, backward=True)
