"""SwiGLU and GeGLU (exact and tanh): forward and input gradient against fp64."""

from __future__ import annotations

import pytest
import torch

from stoker.kernels import gated_units as glu_mod
from tests.kernels.numerics import ON_GPU, Case, assert_matches_fp64, strided

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ACTS = ["silu", "gelu", "gelu_tanh"]
SHAPES = [((1,), 64), ((3, 7), 129), ((5,), 1500)]  # 1500: two column blocks, a tail
if ON_GPU:
    SHAPES += [((8192,), 4096), ((2, 4096), 8192)]


def _x(lead, h, dtype, device, scale=2.0):
    gen = torch.Generator().manual_seed(17 * h + len(lead))
    return (scale * torch.randn(*lead, 2 * h, generator=gen, dtype=torch.float64)).to(device, dtype)


def call(backend, x, activation):
    return glu_mod.glu(x, activation, backend=backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "h"), SHAPES, ids=str)
@pytest.mark.parametrize("activation", ACTS)
def test_glu(lead, h, dtype, activation, device):
    fn = lambda backend, x: call(backend, x, activation)  # noqa: E731
    assert_matches_fp64(fn, Case({"x": _x(lead, h, dtype, device)}, ("x",)))


# The interpreter runs exp in numpy, which warns where exp(-a) overflows to
# inf; sigmoid is then exactly 0, as on the GPU.
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("activation", ACTS)
def test_glu_non_contiguous_and_edges(dtype, activation, device):
    fn = lambda backend, x: call(backend, x, activation)  # noqa: E731
    x = strided(_x((4, 3), 100, dtype, device), pad=7)
    assert not x.is_contiguous()
    assert_matches_fp64(fn, Case({"x": x}, ("x",)))
    # Saturated gates: silu/gelu tails, where act' -> 0 or 1 and exp overflows.
    big = 60.0 if dtype == torch.float16 else 300.0
    assert_matches_fp64(fn, Case({"x": _x((3,), 200, dtype, device, scale=big)}, ("x",)))
    assert_matches_fp64(fn, Case({"x": torch.zeros(2, 64, dtype=dtype, device=device)}, ("x",)))


def test_mlp_modules(device):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32, device=device)
    for mlp in (glu_mod.SwiGLU(32, 48), glu_mod.GeGLU(32, 48, approximate="tanh")):
        mlp = mlp.to(device)
        mlp.backend = "triton"
        got = mlp(x)
        mlp.backend = "reference"
        torch.testing.assert_close(got, mlp(x))
        assert got.shape == x.shape


def test_errors_name_the_value():
    with pytest.raises(ValueError, match=r"last dim of \(2, 7\) is odd"):
        glu_mod.swiglu(torch.randn(2, 7))
    with pytest.raises(ValueError, match="'relu' is not one of silu, gelu, gelu_tanh"):
        glu_mod.glu(torch.randn(2, 8), "relu")  # type: ignore[arg-type]
