"""Tolerance from eager torch's own error: a kernel passes when its distance
from an fp64 reference is at most ERROR_FACTOR times the distance eager torch
makes at the same dtype (plus a few units in the last place, for results that
eager gets exactly). No per-test atol to tune."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from stoker.kernels.backend import Backend

# Our kernels round once at the end like the reference; sums run in another
# order (per-program partials), which costs at most a small factor.
ERROR_FACTOR = 3.0
# Real shapes on a GPU; small ones in Triton's interpreter (conftest.py sets it) on CPU.
ON_GPU = torch.cuda.is_available()
ULPS = 2.0

Outputs = torch.Tensor | Sequence[torch.Tensor]
KernelCall = Callable[..., Outputs]


@dataclass
class Case:
    """Inputs at the test dtype; `grads` names those whose gradient is checked."""

    inputs: dict[str, torch.Tensor | None]
    grads: tuple[str, ...]


def strided(t: torch.Tensor, pad: int = 3) -> torch.Tensor:
    """The same values with a row stride wider than the row: a slice of a
    wider buffer, as q/k/v split out of one projection are."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + pad, dtype=t.dtype, device=t.device)
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


def _as_tuple(out: Outputs) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _run(
    fn: KernelCall, case: Case, backend: Backend, cast: torch.dtype | None, upstream: list
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    leaves: dict[str, torch.Tensor | None] = {}
    for name, t in case.inputs.items():
        if t is None:
            leaves[name] = None
            continue
        v = t.detach()
        if cast is not None and v.is_floating_point():
            v = v.to(cast)
        if name in case.grads:
            v = v.clone().requires_grad_(True) if cast is not None else _leaf_like(v)
        leaves[name] = v
    outs = _as_tuple(fn(backend=backend, **leaves))
    if not upstream:
        gen = torch.Generator(device="cpu").manual_seed(1234)
        for o in outs:
            g = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)
            upstream.append(g.to(o.dtype).double())  # values every dtype can hold
    diff = [o for o in outs if o.requires_grad]
    if diff:
        torch.autograd.backward(
            diff, [g.to(o.dtype) for o, g in zip(outs, upstream, strict=False) if o.requires_grad]
        )
    grads = {}
    for name in case.grads:
        t = leaves[name]
        assert t is not None and t.grad is not None, f"no gradient reached {name}"
        grads[name] = t.grad
    return [o.detach() for o in outs], grads


def _leaf_like(v: torch.Tensor) -> torch.Tensor:
    """A leaf that keeps v's strides, so the kernel sees the non-contiguous layout."""
    leaf = v.detach().clone() if v.is_contiguous() else v.detach()
    return leaf.requires_grad_(True) if not leaf.requires_grad else leaf


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.double() - ref).abs().max().item() if a.numel() else 0.0


def _ulp(dtype: torch.dtype, ref: torch.Tensor) -> float:
    return ULPS * torch.finfo(dtype).eps * (ref.abs().max().item() if ref.numel() else 0.0)


def assert_matches_fp64(fn: KernelCall, case: Case) -> None:
    """Forward and every gradient of the Triton kernel against fp64, with the
    tolerance eager torch earns at the inputs' dtype."""
    dtype = next(t.dtype for t in case.inputs.values() if t is not None and t.is_floating_point())
    upstream: list[torch.Tensor] = []
    ours, ours_g = _run(fn, case, "triton", None, upstream)
    eager, eager_g = _run(fn, case, "reference", None, upstream)
    exact, exact_g = _run(fn, case, "reference", torch.float64, upstream)
    failures = []
    pairs = [(f"output {i}", ours[i], eager[i], exact[i]) for i in range(len(exact))]
    pairs += [(f"grad {n}", ours_g[n], eager_g[n], exact_g[n]) for n in case.grads]
    for what, got, base, ref in pairs:
        assert got.shape == ref.shape, f"{what}: shape {tuple(got.shape)} != {tuple(ref.shape)}"
        assert got.dtype == base.dtype, f"{what}: dtype {got.dtype} != eager {base.dtype}"
        if not torch.isfinite(got).all():
            failures.append(f"{what}: not finite")
            continue
        err, eager_err = _err(got, ref), _err(base, ref)
        tol = ERROR_FACTOR * eager_err + _ulp(got.dtype, ref)
        if err > tol:
            failures.append(f"{what}: error {err:.3g} > {tol:.3g} (eager torch: {eager_err:.3g})")
    assert not failures, f"{dtype}: " + "; ".join(failures)
