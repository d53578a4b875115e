"""Cross-entropy over class logits (a language model's vocabulary, up to 64k
classes and beyond) that never materialises the fp32 softmax.

One Triton kernel pair (stoker/kernels/ops/cross_entropy.py) behind one custom
op pair, `stoker::cross_entropy_fwd` / `stoker::cross_entropy_bwd`, both per
row. The forward reads the logits once with an online softmax and writes the
row's loss and logsumexp; the backward reads the logits again and writes the
gradient once. The reduction over rows happens in torch around the ops, on [N]
floats, so `mean` reaches the backward as a per-row scale.

Semantics are torch.nn.functional.cross_entropy's with class-index targets,
except in two places:
- when every target is `ignore_index`, reduction="mean" gives 0.0 with zero
  gradients (torch gives NaN: 0 / 0). A batch of pure padding then cannot put
  NaN into the weights.
- the loss is fp32 for fp32, bf16 and fp16 logits (fp64 for fp64), not the
  logits' dtype: a bf16 loss keeps 3 significant digits.
Probability (soft) targets and per-class weights are not supported.

Out-of-range targets (neither ignore_index nor in [0, V)): the reference raises
IndexError as torch does on the CPU. The Triton path cannot check without a
host sync (the targets live on the GPU), so it never uses such a target as an
address and makes that row's loss and gradient NaN instead; a mean over the
batch is then NaN.
"""

from __future__ import annotations

from typing import Literal

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

Reduction = Literal["mean", "sum", "none"]
REDUCTIONS: tuple[Reduction, ...] = ("mean", "sum", "none")
# What the Triton kernels read (fp32 math inside); fp64 has the reference.
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# --- reference ---------------------------------------------------------------


def cross_entropy_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: Reduction = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy of [..., V] logits against [...] class indices in pure
    torch, in fp32 (fp64 for fp64 logits), as the Triton kernel computes it.
    Returns the loss in that dtype: [...] for reduction="none", else a scalar."""
    _check_inputs(logits, target, reduction, label_smoothing)
    lf = logits.to(compute_dtype(logits.dtype))
    target = target.long()  # uint8 / int16 targets compare with -100 as numbers
    keep = target != ignore_index
    index = torch.where(keep, target, 0)
    if not torch.compiler.is_compiling():
        _check_range(index, lf.shape[-1])
    lse = torch.logsumexp(lf, dim=-1)
    loss = lse - lf.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    if label_smoothing > 0.0:
        # torch's definition: (1 - eps) * nll + eps * mean over classes of -log p.
        loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - lf.mean(dim=-1))
    # where, not a multiply by keep: an ignored row's gradient is an exact zero.
    return _reduce(torch.where(keep, loss, 0.0), target, ignore_index, reduction)


def _check_range(index: torch.Tensor, v: int) -> None:
    """IndexError for a target outside [0, V), as torch raises on the CPU. A
    host sync: the reference pays it, the Triton path does not (see above).
    Skipped under torch.compile, where the data-dependent branch would break
    the graph (gather's own bounds check remains), and on the meta device, where
    there are no values to check (a shape-only forward)."""
    if index.device.type == "meta":
        return
    bad = (index < 0) | (index >= v)
    if bool(bad.any()):
        value = int(index[bad][0])
        raise IndexError(
            f"target {value} is out of bounds for {v} classes; targets must be in [0, {v}) "
            "or equal ignore_index"
        )


def _reduce(
    loss: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: Reduction
) -> torch.Tensor:
    """Per-row losses (0 on ignored rows) reduced over rows. The mean divides
    by the kept-row count as a device tensor (no .item(), no sync), clamped to
    1 so that an all-ignored batch gives 0 rather than torch's NaN."""
    if reduction == "none":
        return loss
    total = loss.sum()
    if reduction == "sum":
        return total
    return total / (target != ignore_index).sum().clamp(min=1)


def _check_inputs(
    logits: torch.Tensor, target: torch.Tensor, reduction: str, label_smoothing: float
) -> None:
    """A ValueError naming the bad value, before any kernel runs."""
    if logits.dim() == 0 or logits.shape[-1] == 0 or not logits.is_floating_point():
        raise ValueError(
            f"logits must be floating point [..., V] with V >= 1 classes; got "
            f"{tuple(logits.shape)} {logits.dtype}"
        )
    if target.shape != logits.shape[:-1]:
        raise ValueError(
            f"target has shape {tuple(target.shape)}; expected {tuple(logits.shape[:-1])}, "
            f"the leading dims of logits {tuple(logits.shape)} (one class index per row)"
        )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(
            f"target is {target.dtype}; it must hold class indices in an integer dtype "
            "(torch.long); probability targets are not supported"
        )
    if target.device != logits.device:
        raise ValueError(
            f"target is on {target.device} but logits are on {logits.device}; move one"
        )
    _check_options(reduction, label_smoothing)


def _check_options(reduction: str, label_smoothing: float) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"reduction {reduction!r} is not one of {', '.join(map(repr, REDUCTIONS))}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(
            f"label_smoothing {label_smoothing} is outside [0, 1); 0.1 is the usual value "
            "(1.0 would make every target uniform)"
        )


# --- custom ops (what torch.compile sees) -------------------------------------


@torch.library.custom_op("stoker::cross_entropy_fwd", mutates_args=())
def cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton forward on [N, V] logits and [N] int64 targets: (loss fp32 [N],
    0 on ignored rows; logsumexp fp32 [N], saved for the backward)."""
    from stoker.kernels.ops import cross_entropy as ops

    return ops.cross_entropy_fwd(logits, target, ignore_index, label_smoothing)


@cross_entropy_fwd.register_fake
def _cross_entropy_fwd_fake(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    n = logits.shape[0]
    return (
        logits.new_empty((n,), dtype=torch.float32),
        logits.new_empty((n,), dtype=torch.float32),
    )


@torch.library.custom_op("stoker::cross_entropy_bwd", mutates_args=())
def cross_entropy_bwd(
    dloss: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> torch.Tensor:
    """Triton backward: dlogits [N, V] in the logits' dtype, from the per-row
    upstream gradient dloss [N] (for mean: the upstream over the row count)."""
    from stoker.kernels.ops import cross_entropy as ops

    return ops.cross_entropy_bwd(dloss, logits, target, lse, ignore_index, label_smoothing)


@cross_entropy_bwd.register_fake
def _cross_entropy_bwd_fake(
    dloss: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> torch.Tensor:
    return logits.new_empty(logits.shape)


# --- autograd ----------------------------------------------------------------


class CrossEntropyFunction(torch.autograd.Function):
    """Triton per-row cross-entropy on [N, V] logits and [N] int64 targets:
    returns the fp32 loss per row (0 on ignored rows); reduce it in torch."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        logits: torch.Tensor,
        target: torch.Tensor,
        ignore_index: int,
        label_smoothing: float,
    ) -> torch.Tensor:
        fwd = ops_cross_entropy_fwd if direct_call(logits) else cross_entropy_fwd
        loss, lse = fwd(logits, target, ignore_index, label_smoothing)
        # The backward recomputes the softmax from the logits and lse rather
        # than keeping an [N, V] gradient or probability tensor from here.
        ctx.save_for_backward(logits, target, lse)
        ctx.ignore_index = ignore_index  # type: ignore[attr-defined]
        ctx.label_smoothing = label_smoothing  # type: ignore[attr-defined]
        return loss

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dloss: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None]:
        if not needs_grad(ctx, 0):
            return None, None, None, None
        logits, target, lse = ctx.saved_tensors  # type: ignore[attr-defined]
        # The mean's and sum's gradient arrives as an expanded scalar (stride
        # 0); the kernel reads one value per row, so N floats are copied.
        dloss = dloss.contiguous()
        bwd = ops_cross_entropy_bwd if direct_call(dloss) else cross_entropy_bwd
        dlogits = bwd(
            dloss,
            logits,
            target,
            lse,
            ctx.ignore_index,  # type: ignore[attr-defined]
            ctx.label_smoothing,  # type: ignore[attr-defined]
        )
        return dlogits, None, None, None


def ops_cross_entropy_fwd(
    logits: torch.Tensor, target: torch.Tensor, ignore_index: int, label_smoothing: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton forward without the custom-op dispatch: eager calls on plain
    tensors take this path (see dispatch.direct_call)."""
    from stoker.kernels.ops import cross_entropy as ops

    return ops.cross_entropy_fwd(logits, target, ignore_index, label_smoothing)


def ops_cross_entropy_bwd(
    dloss: torch.Tensor,
    logits: torch.Tensor,
    target: torch.Tensor,
    lse: torch.Tensor,
    ignore_index: int,
    label_smoothing: float,
) -> torch.Tensor:
    from stoker.kernels.ops import cross_entropy as ops

    return ops.cross_entropy_bwd(dloss, logits, target, lse, ignore_index, label_smoothing)


# --- public functions ----------------------------------------------------------


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    *,
    ignore_index: int = -100,
    reduction: Reduction = "mean",
    label_smoothing: float = 0.0,
    backend: Backend | None = None,
) -> torch.Tensor:
    """Cross-entropy of logits [..., V] (fp32, bf16 or fp16; rows may be a
    slice of a wider buffer) against class indices target [...] (an integer
    dtype). reduction: "mean" over non-ignored targets (0.0 when there are
    none), "sum", or "none" (shape [...], 0 at ignored targets). The loss is
    fp32 (fp64 for fp64 logits); the logits' gradient is in their dtype.

    The Triton path takes V up to ops.cross_entropy.MAX_CLASSES (about 2^31)
    and fp32 / bf16 / fp16 logits; fp64 needs backend="reference". It allocates
    [N] floats in the forward and the [N, V] gradient in the logits' dtype in
    the backward, and no [N, V] fp32 tensor anywhere."""
    _check_inputs(logits, target, reduction, label_smoothing)
    if resolve(backend, logits) == "reference":
        return cross_entropy_reference(
            logits,
            target,
            ignore_index=ignore_index,
            reduction=reduction,
            label_smoothing=label_smoothing,
        )
    if logits.dtype not in TRITON_DTYPES:
        raise ValueError(
            f"the Triton cross-entropy takes fp32, bf16 or fp16 logits, not {logits.dtype}; "
            "use backend='reference' for it"
        )
    rows = as_rows(logits)
    flat = target.reshape(-1).long().contiguous()  # [N] int64: N * 8 bytes, no sync
    loss: torch.Tensor = apply_function(
        CrossEntropyFunction, rows, flat, ignore_index, label_smoothing
    )
    return _reduce(loss.view(target.shape), flat, ignore_index, reduction)


# --- modules -----------------------------------------------------------------


class CrossEntropyLoss(nn.Module):
    """cross_entropy as a module: forward(logits [..., V], target [...])."""

    def __init__(
        self,
        ignore_index: int = -100,
        reduction: Reduction = "mean",
        label_smoothing: float = 0.0,
        *,
        backend: Backend | None = None,
    ) -> None:
        super().__init__()
        _check_options(reduction, label_smoothing)
        self.ignore_index, self.reduction = ignore_index, reduction
        self.label_smoothing, self.backend = label_smoothing, backend

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(
            logits,
            target,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            backend=self.backend,
        )

    def extra_repr(self) -> str:
        return (
            f"ignore_index={self.ignore_index}, reduction={self.reduction}, "
            f"label_smoothing={self.label_smoothing}"
        )
