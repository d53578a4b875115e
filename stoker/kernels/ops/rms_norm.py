"""RMSNorm, fused with an optional residual add and an optional adaLN
modulation, forward and backward, in Triton.

Forward, per row (fp32 inside, one rounding at the end):
    h = x + residual                      (HAS_RESIDUAL; h is stored, rounded)
    n = h * rstd * weight,  rstd = 1 / sqrt(mean(h^2) + eps)
    y = n * (1 + scale[b]) + shift[b]     (HAS_MOD; b = row // rows_per_batch)

Backward: one pass over the rows. A fixed grid of (batch, chunk) programs loops
over its rows and keeps the weight / scale / shift gradients in registers, then
writes one fp32 partial row each; torch sums the few partials. Rows are read
once and dh written once, which is the byte model's minimum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stoker.kernels.ops.launch import block_cols, program_slots, rows_per_program, warps_for


@triton.jit
def _rms_norm_fwd(
    X,
    stride_x,
    R,
    stride_r,
    H,
    W,
    SCALE,
    SHIFT,
    stride_mod,
    Y,
    RSTD,
    M,
    N,
    rows_per_batch,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_MOD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    row_ok = rows < M
    col_ok = cols < N
    mask = row_ok[:, None] & col_ok[None, :]
    h = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
        # Round the sum to the stream's dtype first: the stored h is what the
        # next layer and our backward see, so the norm must be of that h.
        h = (h.to(tl.float32) + r.to(tl.float32)).to(H.dtype.element_ty)
        tl.store(H + rows[:, None] * N + cols[None, :], h, mask=mask)
    h = h.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(h * h, axis=1) / N + eps)
    y = h * rstd[:, None]
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        y = y * w[None, :]
    if HAS_MOD:
        b = rows // rows_per_batch
        mod = b[:, None] * stride_mod + cols[None, :]
        scale = tl.load(SCALE + mod, mask=mask, other=0.0).to(tl.float32)
        shift = tl.load(SHIFT + mod, mask=mask, other=0.0).to(tl.float32)
        y = y * (1.0 + scale) + shift
    tl.store(Y + rows[:, None] * N + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + rows, rstd, mask=row_ok)


@triton.jit
def _rms_norm_bwd(
    DY,
    DH_OUT,
    H,
    stride_h,
    W,
    SCALE,
    stride_mod,
    RSTD,
    DH,
    DW_PART,
    DSCALE_PART,
    DSHIFT_PART,
    N,
    rows_per_batch,
    rows_per_chunk,
    HAS_DH_OUT: tl.constexpr,
    HAS_WEIGHT: tl.constexpr,
    HAS_MOD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    batch = tl.program_id(0)
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < N
    batch_start = batch.to(tl.int64) * rows_per_batch
    begin = chunk * rows_per_chunk
    end = tl.minimum(begin + rows_per_chunk, rows_per_batch)
    if HAS_WEIGHT:
        w = tl.load(W + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw = tl.zeros((BLOCK_N,), dtype=tl.float32)
    if HAS_MOD:
        scale = tl.load(SCALE + batch * stride_mod + cols, mask=col_ok, other=0.0).to(tl.float32)
        dscale = tl.zeros((BLOCK_N,), dtype=tl.float32)
        dshift = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(begin, end, BLOCK_M):
        local = start + tl.arange(0, BLOCK_M)
        row_ok = local < end
        rows = batch_start + local
        mask = row_ok[:, None] & col_ok[None, :]
        h = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0)
        dy = tl.load(DY + rows[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)
        xhat = h.to(tl.float32) * rstd[:, None]
        n = xhat * w[None, :] if HAS_WEIGHT else xhat
        if HAS_MOD:
            dshift += tl.sum(dy, axis=0)
            dscale += tl.sum(dy * n, axis=0)
            dn = dy * (1.0 + scale[None, :])
        else:
            dn = dy
        if HAS_WEIGHT:
            dw += tl.sum(dn * xhat, axis=0)
            dxhat = dn * w[None, :]
        else:
            dxhat = dn
        c = tl.sum(dxhat * xhat, axis=1) / N
        dh = (dxhat - xhat * c[:, None]) * rstd[:, None]
        if HAS_DH_OUT:
            dh += tl.load(DH_OUT + rows[:, None] * N + cols[None, :], mask=mask, other=0.0).to(
                tl.float32
            )
        tl.store(DH + rows[:, None] * N + cols[None, :], dh.to(DH.dtype.element_ty), mask=mask)
    part = (batch * chunks + chunk).to(tl.int64) * N + cols
    if HAS_WEIGHT:
        tl.store(DW_PART + part, dw, mask=col_ok)
    if HAS_MOD:
        tl.store(DSCALE_PART + part, dscale, mask=col_ok)
        tl.store(DSHIFT_PART + part, dshift, mask=col_ok)


def rms_norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    shift: torch.Tensor | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, residual: [M, N] with unit column stride; scale, shift: [B, N] with
    M % B == 0. Returns y [M, N], h [M, N] (empty without residual), rstd [M] fp32."""
    m, n = x.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    h = torch.empty((m, n) if residual is not None else (0,), dtype=x.dtype, device=x.device)
    rstd = torch.empty((m,), dtype=torch.float32, device=x.device)
    if m == 0:
        return y, h, rstd
    block_n = block_cols(n)
    block_m = rows_per_program(block_n)
    batches = scale.shape[0] if scale is not None else 1
    _rms_norm_fwd[(triton.cdiv(m, block_m),)](
        x,
        x.stride(0),
        residual if residual is not None else x,
        residual.stride(0) if residual is not None else 0,
        h,
        weight if weight is not None else x,
        scale if scale is not None else x,
        shift if shift is not None else x,
        scale.shape[1] if scale is not None else 0,
        y,
        rstd,
        m,
        n,
        m // batches,
        eps,
        HAS_RESIDUAL=residual is not None,
        HAS_WEIGHT=weight is not None,
        HAS_MOD=scale is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=warps_for(block_m * block_n),
    )
    return y, h, rstd


def rms_norm_bwd(
    dy: torch.Tensor,
    dh_out: torch.Tensor | None,
    h: torch.Tensor,
    weight: torch.Tensor | None,
    scale: torch.Tensor | None,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy, dh_out: contiguous [M, N]; h: the normalised input [M, N] (unit
    column stride). Returns dh (for x and residual), dweight, dscale, dshift."""
    m, n = h.shape
    dh = torch.empty((m, n), dtype=h.dtype, device=h.device)
    batches = scale.shape[0] if scale is not None else 1
    rows_per_batch = m // batches if batches else 0
    block_n = block_cols(n)
    block_m = rows_per_program(block_n)
    chunks = max(1, min(triton.cdiv(rows_per_batch, block_m), program_slots(h.device) // batches))
    rows_per_chunk = triton.cdiv(rows_per_batch, chunks) if rows_per_batch else 0
    parts = batches * chunks
    dw_part = rstd.new_empty((parts, n)) if weight is not None else rstd
    dscale_part = rstd.new_empty((parts, n)) if scale is not None else rstd
    dshift_part = rstd.new_empty((parts, n)) if scale is not None else rstd
    if m:
        _rms_norm_bwd[(batches, chunks)](
            dy,
            dh_out if dh_out is not None else dy,
            h,
            h.stride(0),
            weight if weight is not None else rstd,
            scale if scale is not None else rstd,
            scale.shape[1] if scale is not None else 0,
            rstd,
            dh,
            dw_part,
            dscale_part,
            dshift_part,
            n,
            rows_per_batch,
            rows_per_chunk,
            HAS_DH_OUT=dh_out is not None,
            HAS_WEIGHT=weight is not None,
            HAS_MOD=scale is not None,
            BLOCK_M=block_m,
            BLOCK_N=block_n,
            num_warps=warps_for(block_m * block_n),
        )
    elif weight is not None or scale is not None:
        for part in (dw_part, dscale_part, dshift_part):
            part.zero_()
    dweight = dw_part.sum(0).to(weight.dtype) if weight is not None else None
    dscale = dshift = None
    if scale is not None:
        dscale = dscale_part.view(batches, chunks, n).sum(1).to(scale.dtype)
        dshift = dshift_part.view(batches, chunks, n).sum(1).to(scale.dtype)
    return dh, dweight, dscale, dshift
