"""What the kernel benchmark runs: for each kernel, its shapes, inputs, the
stoker call, the eager torch call (which torch.compile also compiles), the
Liger-Kernel call where Liger has the op, and the byte model.

Byte model: the bytes a kernel must move at the least, reading each input and
writing each output once (small per-row or per-channel vectors such as rstd,
weights and cos/sin tables are left out). GB/s = bytes / time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from stoker.kernels import cross_entropy_loss as ce
from stoker.kernels import gated_units as glu
from stoker.kernels import norms, rope

Shape = dict[str, int]
Mode = str  # "fwd", "bwd", "fwd+bwd"
MODES: tuple[Mode, ...] = ("fwd", "bwd", "fwd+bwd")

EPS = 1e-6
HEAD_DIM = 128
# The AV DiT's samples per batch for the adaLN norm: scale/shift per sample.
MOD_BATCH = 4
# Cross-entropy rows x classes are capped so logits stay at 4 GiB in bf16.
MAX_LOGITS = 1 << 31


@dataclass(frozen=True)
class Inputs:
    """Positional arguments of a call; `grad` names the positions whose
    gradient the backward computes."""

    args: tuple[Any, ...]
    grad: tuple[int, ...]


@dataclass(frozen=True)
class Impl:
    """A way to run the op: `prepare` turns the common inputs into this
    implementation's own layout (untimed), `call` runs it (timed)."""

    call: Callable[..., Any]
    prepare: Callable[[Inputs], Inputs] = field(default=lambda inputs: inputs)


@dataclass(frozen=True)
class KernelCase:
    name: str
    shapes: Callable[[Sequence[int], Sequence[int], Sequence[int]], list[Shape]]
    make: Callable[[Shape, torch.dtype, torch.device], Inputs]
    stoker: Impl
    eager: Impl
    bytes: Callable[[Shape, int, Mode], int]
    liger: Callable[[], Impl | None] = field(default=lambda: None)


def _randn(*shape: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device)


def _liger(module: str, name: str) -> Any:
    """A Liger-Kernel autograd.Function, or None when Liger is not installed."""
    try:
        return getattr(importlib.import_module(f"liger_kernel.ops.{module}"), name)
    except ImportError:
        return None


def _token_hidden(tokens: Sequence[int], hidden: Sequence[int], _: Sequence[int]) -> list[Shape]:
    return [{"tokens": t, "hidden": h} for t in tokens for h in hidden]


# --- RMSNorm and its fused forms --------------------------------------------


def _norm_bytes(
    reads: int, writes: int, bwd_reads: int, bwd_writes: int
) -> Callable[[Shape, int, Mode], int]:
    def model(shape: Shape, elem: int, mode: Mode) -> int:
        plane = shape["tokens"] * shape["hidden"] * elem
        fwd, bwd = (reads + writes) * plane, (bwd_reads + bwd_writes) * plane
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]

    return model


def _make_rms(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    x = _randn(shape["tokens"], shape["hidden"], dtype=dtype, device=device)
    return Inputs((x, torch.ones(shape["hidden"], dtype=dtype, device=device)), (0, 1))


def _liger_rms() -> Impl | None:
    fn = _liger("rms_norm", "LigerRMSNormFunction")
    # in_place=False: Liger's in-place backward overwrites dy, which a timed
    # loop of backwards reuses.
    return fn and Impl(lambda x, w: fn.apply(x, w, EPS, 0.0, "llama", False))


def _make_add(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    x, w = _make_rms(shape, dtype, device).args
    return Inputs((x, torch.randn_like(x), w), (0, 1, 2))


def _liger_add() -> Impl | None:
    fn = _liger("fused_add_rms_norm", "LigerFusedAddRMSNormFunction")
    return fn and Impl(lambda x, r, w: fn.apply(x, r, w, EPS, 0.0, "llama", False))


def _make_mod(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    t, h = shape["tokens"], shape["hidden"]
    x = _randn(MOD_BATCH, t // MOD_BATCH, h, dtype=dtype, device=device)
    scale, shift = (0.1 * _randn(MOD_BATCH, h, dtype=dtype, device=device) for _ in range(2))
    return Inputs((x, scale, shift), (0, 1, 2))


def _liger_mod() -> Impl | None:
    fn = _liger("modulated_rms_norm", "LigerModulatedRMSNormFunction")
    return fn and Impl(lambda x, s, b: fn.apply(x, None, s, b, EPS, 0.0, "llama", False))


# --- gated units -------------------------------------------------------------


def _glu_bytes(shape: Shape, elem: int, mode: Mode) -> int:
    plane = shape["tokens"] * shape["hidden"] * elem
    fwd, bwd = 3 * plane, 5 * plane  # fwd: read a, b, write y; bwd: + dy, write da, db
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


def _make_glu(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    return Inputs((_randn(shape["tokens"], 2 * shape["hidden"], dtype=dtype, device=device),), (0,))


def _liger_swiglu() -> Impl | None:
    fn = _liger("swiglu", "LigerFusedGateUpSiLUMulFunction")
    return fn and Impl(lambda x: fn.apply(x, False))


def _liger_geglu() -> Impl | None:
    fn = _liger("geglu", "LigerGELUMulFunction")
    # Liger takes gate and up as two tensors (its GELU is the tanh one).
    return fn and Impl(
        lambda a, b: fn.apply(a, b),
        lambda i: Inputs(tuple(t.contiguous() for t in i.args[0].chunk(2, -1)), (0, 1)),
    )


# --- rotary embedding ---------------------------------------------------------


def _rope_shapes(tokens: Sequence[int], hidden: Sequence[int], _: Sequence[int]) -> list[Shape]:
    return [{"tokens": t, "hidden": h, "heads": h // HEAD_DIM} for t in tokens for h in hidden]


def _rope_bytes(shape: Shape, elem: int, mode: Mode) -> int:
    one_pass = 2 * 2 * shape["tokens"] * shape["hidden"] * elem  # q and k, read + write
    return {"fwd": one_pass, "bwd": one_pass, "fwd+bwd": 2 * one_pass}[mode]


def _make_rope(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    t, heads = shape["tokens"], shape["heads"]
    q = _randn(1, t, heads, HEAD_DIM, dtype=dtype, device=device)
    k = _randn(1, t, heads, HEAD_DIM, dtype=dtype, device=device)
    cos, sin = rope.rope_table_1d(t, HEAD_DIM, device=device)
    return Inputs((q, k, cos, sin), (0, 1))


def _liger_rope() -> Impl | None:
    fn = _liger("rope", "LigerRopeFunction")

    def prepare(inputs: Inputs) -> Inputs:
        # Liger's layout: [B, H, S, D] and full-width (duplicated) cos/sin.
        q, k, cos, sin = inputs.args
        q, k = (t.transpose(1, 2).contiguous() for t in (q, k))
        cos, sin = (torch.cat([c, c], dim=-1).to(q.dtype) for c in (cos, sin))
        return Inputs((q, k, cos, sin), (0, 1))

    return fn and Impl(lambda q, k, cos, sin: fn.apply(q, k, cos, sin), prepare)


# --- cross-entropy --------------------------------------------------------------


def _ce_shapes(tokens: Sequence[int], _: Sequence[int], vocab: Sequence[int]) -> list[Shape]:
    return [{"tokens": t, "vocab": v} for t in tokens for v in vocab if t * v <= MAX_LOGITS]


def _ce_bytes(shape: Shape, elem: int, mode: Mode) -> int:
    plane = shape["tokens"] * shape["vocab"] * elem
    return {"fwd": plane, "bwd": 2 * plane, "fwd+bwd": 3 * plane}[mode]


def _make_ce(shape: Shape, dtype: torch.dtype, device: torch.device) -> Inputs:
    logits = _randn(shape["tokens"], shape["vocab"], dtype=dtype, device=device)
    target = torch.randint(0, shape["vocab"], (shape["tokens"],), device=device)
    return Inputs((logits, target), (0,))


def _liger_ce() -> Impl | None:
    fn = _liger("cross_entropy", "LigerCrossEntropyFunction")
    # Liger writes the gradient into the logits during the forward: its own copy.
    return fn and Impl(
        lambda logits, target: fn.apply(logits, target, None)[0],
        lambda i: Inputs((i.args[0].detach().clone(), i.args[1]), (0,)),
    )


CASES: dict[str, KernelCase] = {
    c.name: c
    for c in (
        KernelCase(
            "rms_norm",
            _token_hidden,
            _make_rms,
            Impl(lambda x, w: norms.rms_norm(x, w, EPS)),
            Impl(lambda x, w: norms.rms_norm_reference(x, w, EPS)[0]),
            # fwd: read x, write y; bwd: read x, dy, write dx
            _norm_bytes(1, 1, 2, 1),
            _liger_rms,
        ),
        KernelCase(
            "add_rms_norm",
            _token_hidden,
            _make_add,
            Impl(lambda x, r, w: norms.add_rms_norm(x, r, w, EPS)),
            Impl(lambda x, r, w: norms.rms_norm_reference(x, w, EPS, residual=r)),
            # fwd: read x, r, write y, h; bwd: read h, dy, dh, write dx (= dr)
            _norm_bytes(2, 2, 3, 1),
            _liger_add,
        ),
        KernelCase(
            "modulated_rms_norm",
            _token_hidden,
            _make_mod,
            Impl(lambda x, s, b: norms.modulated_rms_norm(x, s, b, None, EPS)),
            Impl(lambda x, s, b: norms.rms_norm_reference(x, None, EPS, scale=s, shift=b)[0]),
            _norm_bytes(1, 1, 2, 1),
            _liger_mod,
        ),
        KernelCase(
            "swiglu",
            _token_hidden,
            _make_glu,
            Impl(lambda x: glu.swiglu(x)),
            Impl(lambda x: glu.glu_reference(x, "silu")),
            _glu_bytes,
            _liger_swiglu,
        ),
        KernelCase(
            "geglu",
            _token_hidden,
            _make_glu,
            Impl(lambda x: glu.geglu(x, approximate="tanh")),
            Impl(lambda x: glu.glu_reference(x, "gelu_tanh")),
            _glu_bytes,
            _liger_geglu,
        ),
        KernelCase(
            "rope",
            _rope_shapes,
            _make_rope,
            Impl(lambda q, k, cos, sin: rope.apply_rope(q, k, cos, sin)),
            Impl(lambda q, k, cos, sin: rope.rope_reference(q, k, cos, sin)),
            _rope_bytes,
            _liger_rope,
        ),
        KernelCase(
            "cross_entropy",
            _ce_shapes,
            _make_ce,
            Impl(lambda logits, target: ce.cross_entropy(logits, target)),
            Impl(lambda logits, target: ce.cross_entropy_reference(logits, target)),
            _ce_bytes,
            _liger_ce,
        ),
    )
}
