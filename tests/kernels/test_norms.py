"""RMSNorm, residual add + RMSNorm and adaLN-modulated RMSNorm: forward and
every gradient against fp64, on nice and odd shapes, in fp32, bf16 and fp16."""

from __future__ import annotations

import pytest
import torch

from stoker.kernels import norms
from tests.kernels.numerics import ON_GPU, Case, assert_matches_fp64, strided

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (leading dims, hidden): one row; odd sizes not a multiple of any block; a
# hidden size above one warp's tile. Real DiT shapes only where a GPU runs them.
SHAPES = [((1,), 64), ((3, 7), 129), ((2, 5), 300), ((4,), 1000)]
if ON_GPU:
    SHAPES += [((2, 4096), 1024), ((1, 8192), 3072), ((1, 4096), 4096)]


def _x(
    shape: tuple[int, ...], n: int, dtype: torch.dtype, device: torch.device, **kw
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash((shape, n)) % 2**31)
    return torch.randn(*shape, n, generator=gen, dtype=torch.float64).to(device, dtype)


def rms(backend, x, weight):
    return norms.rms_norm(x, weight, 1e-6, backend=backend)


def add_rms(backend, x, residual, weight):
    return norms.add_rms_norm(x, residual, weight, 1e-6, backend=backend)


def modulated(backend, x, scale, shift, weight):
    return norms.modulated_rms_norm(x, scale, shift, weight, 1e-6, backend=backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "n"), SHAPES, ids=str)
@pytest.mark.parametrize("affine", [True, False], ids=["weight", "no-weight"])
def test_rms_norm(lead, n, dtype, affine, device):
    x = _x(lead, n, dtype, device)
    w = 1 + 0.1 * _x((), n, dtype, device) if affine else None
    grads = ("x", "weight") if affine else ("x",)
    assert_matches_fp64(rms, Case({"x": x, "weight": w}, grads))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "n"), SHAPES, ids=str)
def test_add_rms_norm(lead, n, dtype, device):
    x, r = _x(lead, n, dtype, device), _x((*lead, 1), n, dtype, device)[..., 0, :]
    w = 1 + 0.1 * _x((), n, dtype, device)
    case = Case({"x": x, "residual": r, "weight": w}, ("x", "residual", "weight"))
    assert_matches_fp64(add_rms, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "n"), SHAPES, ids=str)
def test_modulated_rms_norm(lead, n, dtype, device):
    x = _x(lead, n, dtype, device)
    batch = lead[0]
    scale = 0.5 * _x((batch,), n + 1, dtype, device)[:, :n]
    shift = _x((batch, 2), n, dtype, device)[:, 1]
    case = Case({"x": x, "scale": scale, "shift": shift, "weight": None}, ("x", "scale", "shift"))
    assert_matches_fp64(modulated, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_non_contiguous_inputs(dtype, device):
    x = strided(_x((3, 7), 129, dtype, device))
    assert not x.is_contiguous()
    w = 1 + 0.1 * _x((), 129, dtype, device)
    assert_matches_fp64(rms, Case({"x": x, "weight": w}, ("x", "weight")))
    xt = _x((129,), 6, dtype, device).t()  # last dim not unit-stride: copied
    assert_matches_fp64(rms, Case({"x": xt, "weight": None}, ("x",)))
    r = strided(_x((3, 7), 129, dtype, device), pad=5)
    case = Case({"x": x, "residual": r, "weight": w}, ("x", "residual", "weight"))
    assert_matches_fp64(add_rms, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "values",
    ["equal", "zeros", "huge", "tiny"],
)
def test_edge_values(values, dtype, device):
    x = _x((5,), 257, dtype, device)
    if values == "equal":  # every row constant: rstd = 1/|c|
        x = torch.full_like(x, 0.75) * torch.arange(1, 6, device=device, dtype=dtype)[:, None]
    elif values == "zeros":  # rstd = 1/sqrt(eps): finite, gradient eps-scaled
        x = torch.zeros_like(x)
    elif values == "huge":
        # fp16: |x| near its max, so x^2 exists only in the fp32 accumulator.
        # bf16/fp32: 1e15, as high as sum(x^2) stays inside fp32 (eager's limit too).
        x = x * (1.5e4 if dtype == torch.float16 else 1e15)
    elif values == "tiny":  # far below eps: output ~ x / sqrt(eps)
        x = x * (1e-4 if dtype == torch.float16 else 1e-30)
    w = 1 + 0.1 * _x((), 257, dtype, device)
    assert torch.isfinite(x).all()
    assert_matches_fp64(rms, Case({"x": x, "weight": w}, ("x", "weight")))


def test_shape_errors_name_the_shapes(device):
    x = torch.randn(2, 3, 8, device=device)
    with pytest.raises(ValueError, match=r"scale has shape \(3, 8\).*\(2, 8\)"):
        norms.modulated_rms_norm(x, torch.randn(3, 8, device=device), torch.randn(2, 8))
    with pytest.raises(ValueError, match=r"weight has shape \(7,\); expected \(8,\)"):
        norms.rms_norm(x, torch.randn(7, device=device))
    with pytest.raises(ValueError, match="residual"):
        norms.add_rms_norm(x, x.half())


def test_modules_match_functions(device):
    x = torch.randn(2, 5, 64, device=device)
    cond = torch.randn(2, 64, device=device)
    ada = norms.AdaLNRMSNorm(64, backend="triton").to(device)
    assert ada.weight is None
    torch.testing.assert_close(
        ada(x, cond, -cond), norms.modulated_rms_norm(x, cond, -cond, backend="reference")
    )
    add = norms.AddRMSNorm(64, backend="triton").to(device)
    y, h = add(x, x)
    torch.testing.assert_close(h, 2 * x)
    torch.testing.assert_close(y, norms.rms_norm(2 * x, add.weight, backend="reference"))
