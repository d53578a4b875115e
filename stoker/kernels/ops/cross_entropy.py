"""Cross-entropy over a large vocabulary, forward and backward, in Triton,
without ever holding the softmax: one program per row loops over the classes
in blocks (fp32 inside).

Forward, per row (one read of the logits, writes two floats):
    M, S = running max and rescaled running sum of exp(x - M), block by block
    lse  = M + log(S)
    loss = log(S) + (M - x[t]) - eps * sum(x - x[t]) / V
         = lse - (1 - eps) * x[t] - eps * mean(x)     (eps: label smoothing)
Written in the first form because M - x[t] is exact for close values, so a
confident row's small loss keeps its digits instead of being lse - x[t].

Backward, per row (one read of the logits, one write of the gradient):
    dx = (exp(x - lse) - (1 - eps) * onehot(t) - eps / V) * dloss[row]

Ignored rows (target == ignore_index) read nothing: the forward writes
loss = lse = 0 and the backward writes zeros. A target outside [0, V) is never
used as an address (its load is masked); that row's loss and gradient are NaN,
the one signal a kernel can give without a host sync.

Bytes: 2 reads and 1 write of an [N, V] tensor in the logits' dtype, for any
upstream gradient, with no host sync. Liger-Kernel reads once and writes the
unscaled gradient over the logits in the forward (2 passes, even in eval), then
skips the scaling when the upstream is exactly 1 (checked with a host sync) and
otherwise reads and writes it again: 4 passes under loss scaling or gradient
accumulation's 1/k. Its in-place write saves one logits-sized buffer, which
this design spends: the logits stay intact (saved) until the backward
allocates the gradient.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from stoker.kernels.ops.launch import warps_for

# Classes per loop step. 8192 bf16 values is 16 KiB in flight per program, 16
# values per thread on 16 warps: enough loads in flight per SM to stream at
# bandwidth, few enough registers to keep several programs resident. The
# block-wide max and sum it costs per step are small next to the exp per value.
_MAX_BLOCK = 8192

# Column offsets inside a row are int32 (start + arange); row offsets are
# int64. A row must leave room for the last block's overshoot.
MAX_CLASSES = 2**31 - 1 - _MAX_BLOCK


@triton.jit
def _cross_entropy_fwd(
    X,
    stride_x,
    T,
    LOSS,
    LSE,
    V,
    ignore_index,
    label_smoothing,
    HAS_SMOOTHING: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    t = tl.load(T + row)
    keep = t != ignore_index
    valid = (t >= 0) & (t < V)
    x_t = tl.load(x_row + tl.where(valid, t, 0), mask=keep & valid, other=0.0).to(tl.float32)
    # An ignored row runs no iterations: padding tokens cost no logit reads.
    end = tl.where(keep, V, 0)
    m = float("-inf")
    s = 0.0
    sum_d = 0.0
    for start in range(0, end, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        x = tl.load(x_row + cols, mask=col_ok, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        # While every logit so far is -inf (a masked vocabulary), shift by 0
        # instead: -inf - -inf would make s NaN.
        shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - shift) + tl.sum(tl.exp(x - shift), axis=0)
        m = m_new
        if HAS_SMOOTHING:
            # Sum x - x[t], not x: logits with a large common offset would
            # round their sum at the offset's scale, not the spread's.
            sum_d += tl.sum(tl.where(col_ok, x - x_t, 0.0), axis=0)
    log_s = tl.log(tl.where(keep, s, 1.0))  # s = 0 on ignored rows
    loss = log_s + (m - x_t)
    if HAS_SMOOTHING:
        loss -= label_smoothing * (sum_d / V)
    loss = tl.where(valid, loss, float("nan"))
    tl.store(LOSS + row, tl.where(keep, loss, 0.0))
    tl.store(LSE + row, tl.where(keep, m + log_s, 0.0))


@triton.jit
def _cross_entropy_bwd(
    DLOSS,
    X,
    stride_x,
    T,
    LSE,
    DX,
    V,
    ignore_index,
    label_smoothing,
    HAS_SMOOTHING: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = X + row * stride_x
    dx_row = DX + row * V
    t = tl.load(T + row)
    keep = t != ignore_index
    valid = (t >= 0) & (t < V)
    lse = tl.load(LSE + row)
    scale = tl.where(valid, tl.load(DLOSS + row).to(tl.float32), float("nan"))
    # Ignored rows load nothing (all masked) and store exact zeros: their
    # upstream gradient may be anything, even inf, under reduction="none".
    end = tl.where(keep, V, 0)
    hit = 1.0 - label_smoothing
    floor = label_smoothing / V
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        col_ok = cols < V
        # -inf past the row's end: exp gives 0 there, not exp(-lse), which
        # can overflow the cast of lanes that are never stored.
        x = tl.load(x_row + cols, mask=cols < end, other=float("-inf")).to(tl.float32)
        g = tl.exp(x - lse)
        if HAS_SMOOTHING:
            g = g - floor
        g = tl.where(cols == t, g - hit, g)
        dx = tl.where(keep, g * scale, 0.0)
        tl.store(dx_row + cols, dx.to(DX.dtype.element_ty), mask=col_ok)


def _block(v: int) -> int:
    return min(triton.next_power_of_2(v), _MAX_BLOCK)


def _check(logits: torch.Tensor) -> None:
    # Checked here too for callers of the custom ops themselves.
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(
            f"the Triton cross-entropy takes fp32, bf16 or fp16 logits, not {logits.dtype}; "
            "use backend='reference' for it"
        )
    if logits.shape[1] > MAX_CLASSES:
        raise ValueError(
            f"{logits.shape[1]} classes is above the Triton cross-entropy's limit of "
            f"{MAX_CLASSES} (int32 column offsets); use backend='reference'"
        )


def cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [N, V] with unit column stride (any row stride); target: [N]
    int64. Returns loss [N] fp32 (0 on ignored rows) and lse [N] fp32."""
    _check(logits)
    n, v = logits.shape
    loss = torch.empty((n,), dtype=torch.float32, device=logits.device)
    lse = torch.empty((n,), dtype=torch.float32, device=logits.device)
    if n == 0:
        return loss, lse
    block = _block(v)
    _cross_entropy_fwd[(n,)](
        logits,
        logits.stride(0),
        target,
        loss,
        lse,
        v,
        ignore_index,
        label_smoothing,
        HAS_SMOOTHING=label_smoothing > 0.0,
        BLOCK_V=block,
        num_warps=warps_for(block),
    )
    return loss, lse


def cross_entropy_bwd(
    dloss: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> torch.Tensor:
    """dloss: contiguous [N] (any float dtype); logits, target, lse as the
    forward took and gave them. Returns dlogits: contiguous [N, V] in the
    logits' dtype."""
    _check(logits)
    n, v = logits.shape
    dlogits = torch.empty((n, v), dtype=logits.dtype, device=logits.device)
    if n == 0:
        return dlogits
    block = _block(v)
    _cross_entropy_bwd[(n,)](
        dloss,
        logits,
        logits.stride(0),
        target,
        lse,
        dlogits,
        v,
        ignore_index,
        label_smoothing,
        HAS_SMOOTHING=label_smoothing > 0.0,
        BLOCK_V=block,
        num_warps=warps_for(block),
    )
    return dlogits
