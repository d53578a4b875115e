"""RoPE on q and k: forward and both gradients against fp64 with 1D and 3D
tables, on one token, odd shapes, grouped-query heads and strided views of a
fused qkv, in fp32, bf16 and fp16; the tables' exact properties; the errors."""

from __future__ import annotations

import pytest
import torch

from stoker.kernels import rope
from tests.kernels.numerics import ON_GPU, Case, assert_matches_fp64

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# (B, S, Hq, Hk, D): one token; odd sizes with a head_dim that is not a power
# of two; grouped-query (Hk < Hq) and more k heads than q heads. Real DiT
# shapes only where a GPU runs them.
SHAPES = [(1, 1, 1, 1, 8), (3, 7, 3, 3, 24), (2, 5, 4, 2, 40), (2, 3, 1, 3, 72)]
if ON_GPU:
    SHAPES += [(2, 4096, 16, 16, 64), (2, 4096, 16, 16, 128), (1, 4096, 32, 8, 80)]


def _x(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(hash(shape) % 2**31)
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device, dtype)


def apply(backend, q, k, cos, sin):
    return rope.apply_rope(q, k, cos, sin, backend=backend)


def apply_bhsd(backend, q, k, cos, sin):
    """As attention uses it: outputs transposed to [B, H, S, D], so the
    gradients reach the backward as strided views."""
    return tuple(t.transpose(1, 2) for t in rope.apply_rope(q, k, cos, sin, backend=backend))


def _case(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Case:
    return Case({"q": q, "k": k, "cos": cos, "sin": sin}, ("q", "k"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("b", "s", "hq", "hk", "d"), SHAPES, ids=str)
@pytest.mark.parametrize("positions", ["arange", "far"])
def test_rope_1d(b, s, hq, hk, d, positions, dtype, device):
    q, k = _x((b, s, hq, d), dtype, device), _x((b, s, hk, d + 1), dtype, device)[..., :d]
    # "far": large, fractional positions, where every pair has turned many times.
    pos = torch.arange(s) if positions == "arange" else torch.arange(s) * 613.25 + 1e4
    cos, sin = rope.rope_table_1d(pos.to(device), d)
    assert_matches_fp64(apply, _case(q, k, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("sections", [None, (3, 8, 9), (0, 10, 10)], ids=str)
def test_rope_3d(sections, dtype, device):
    grid, d = (2, 3, 5), 40
    cos, sin = rope.rope_table_3d(grid, d, sections, device=device)
    s = grid[0] * grid[1] * grid[2]
    # One clip: the kernel reads a 3D table as any [S, D/2] table, and batches of
    # several are test_rope_1d's (the interpreter runs one program per token).
    q, k = _x((1, s, 3, d), dtype, device), _x((1, s, 1, d), dtype, device)
    assert_matches_fp64(apply, _case(q, k, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_strided_q_and_k(dtype, device):
    b, s, h, d = 2, 5, 3, 40
    cos, sin = rope.rope_table_1d(s, d, device=device)
    # q, k, v split out of one fused projection: read in place, not copied.
    q, k, _ = _x((b, s, 3 * h * d), dtype, device).view(b, s, 3, h, d).unbind(2)
    assert not q.is_contiguous() and not k.is_contiguous()
    assert_matches_fp64(apply, _case(q, k, cos, sin))
    # q, k as [B, H, S, D] transposed to [B, S, H, D], gradients strided too.
    qt, kt = (_x((b, h, s, d + i), dtype, device).transpose(1, 2)[..., :d] for i in (0, 1))
    assert_matches_fp64(apply_bhsd, _case(qt, kt, cos, sin))
    # A last dim that is not unit-stride is copied first.
    qc = _x((b, s, d, h), dtype, device).transpose(2, 3)
    assert_matches_fp64(apply, _case(qc, k, cos, sin))


def test_empty_and_tiny_shapes(device):
    """No tokens: empty outputs, no launch; one head of head_dim 2: one pair."""
    for shape in ((0, 4, 2, 8), (2, 0, 2, 8), (1, 3, 1, 2)):
        q = torch.randn(shape, device=device)
        cos, sin = rope.rope_table_1d(shape[1], shape[3], device=device)
        got = rope.apply_rope(q, q, cos, sin, backend="triton")
        want = rope.apply_rope(q, q, cos, sin, backend="reference")
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w)


def test_custom_ops_and_compile(device):
    """The ops' fake implementations match them (opcheck), and
    torch.compile(fullgraph=True) traces the module through both ops."""
    qkv = torch.randn(2, 5, 3, 3, 24, device=device)
    q, k, _ = qkv.unbind(2)
    cos, sin = rope.rope_table_1d(5, 24, device=device)
    for op in (torch.ops.stoker.rope_fwd.default, torch.ops.stoker.rope_bwd.default):
        torch.library.opcheck(op, (q, k[:, :, :2], cos, sin))
    seen: set[str] = set()

    def record(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        for sub in gm.modules():
            if isinstance(sub, torch.fx.GraphModule):
                seen.update(str(n.target) for n in sub.graph.nodes if "stoker" in str(n.target))
        return gm.forward

    module = rope.RoPE(24, max_len=8, backend="triton").to(device)
    compiled = torch.compile(module, fullgraph=True, backend=record)
    results = []
    for fn in (compiled, module):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k)]
        out_q, out_k = fn(*leaves)
        (out_q.sum() + out_k.pow(2).sum()).backward()
        results.append([out_q, out_k] + [t.grad for t in leaves])
    assert seen == {"stoker.rope_fwd.default", "stoker.rope_bwd.default"}
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want)


# --- tables ------------------------------------------------------------------


@pytest.mark.parametrize("sections", [None, (3, 8, 9), (0, 10, 10)], ids=str)
def test_table_3d_sections_are_1d_tables(sections):
    """Token (t, h, w) of a t-major grid has, in the t / h / w section, the 1D
    angles of index t / h / w for that section's head_dim: exactly."""
    grid, d = (2, 3, 5), 40
    cos, sin = rope.rope_table_3d(grid, d, sections)
    split = rope.default_sections(d) if sections is None else sections
    assert cos.shape == sin.shape == (30, 20) and cos.dtype == torch.float32
    index = torch.meshgrid(*(torch.arange(n) for n in grid), indexing="ij")
    start = 0
    for size, pairs, at in zip(grid, split, index, strict=True):
        cols = slice(start, start + pairs)
        start += pairs
        if not pairs:
            continue
        cos_1d, sin_1d = rope.rope_table_1d(size, 2 * pairs)
        assert torch.equal(cos[:, cols], cos_1d[at.flatten()])
        assert torch.equal(sin[:, cols], sin_1d[at.flatten()])


def test_default_sections():
    assert rope.default_sections(64) == (10, 11, 11)
    assert rope.default_sections(128) == (22, 21, 21)
    assert rope.default_sections(96) == (16, 16, 16)
    for d in range(2, 260, 2):
        t, h, w = rope.default_sections(d)
        assert t + h + w == d // 2 and h == w and abs(t - h) <= 1


def test_table_1d_angles():
    cos, sin = rope.rope_table_1d(torch.tensor([0, 3, 2.5]), 8, theta=100.0)
    angles = torch.tensor([0, 3, 2.5], dtype=torch.float64)[:, None] * 100.0 ** -(
        torch.arange(4, dtype=torch.float64) / 4
    )
    assert cos.dtype == sin.dtype == torch.float32
    torch.testing.assert_close(cos, angles.cos().float())
    torch.testing.assert_close(sin, angles.sin().float())
    by_length = rope.rope_table_1d(3, 8, theta=100.0)
    by_positions = rope.rope_table_1d(torch.arange(3), 8, theta=100.0)
    assert all(torch.equal(a, b) for a, b in zip(by_length, by_positions, strict=True))


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_rotation_preserves_pair_norms(backend, device):
    q, k = _x((2, 5, 3, 24), torch.float32, device), _x((2, 5, 2, 24), torch.float32, device)
    cos, sin = rope.rope_table_1d(torch.arange(5, device=device) * 97.0, 24)
    for x, y in zip((q, k), rope.apply_rope(q, k, cos, sin, backend=backend), strict=True):
        # Pair i is (d_i, d_{i + D/2}): the half-split convention.
        norms = [t[..., :12].square() + t[..., 12:].square() for t in (x, y)]
        torch.testing.assert_close(norms[1], norms[0])
        assert not torch.allclose(y, x)


@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("d", [16, 24])
def test_scores_depend_on_relative_position(backend, d, device):
    """q rotated at m, k rotated at n: q.k depends only on m - n."""
    length = 12
    cos, sin = rope.rope_table_1d(length, d, device=device)
    q0, k0 = _x((d,), torch.float32, device), _x((1, d), torch.float32, device)[0]
    q = q0.expand(1, length, 1, d)
    k = k0.expand(1, length, 1, d)
    q_rot, k_rot = rope.apply_rope(q, k, cos, sin, backend=backend)
    scores = q_rot[0, :, 0] @ k_rot[0, :, 0].T  # [m, n]
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1])
    assert not torch.allclose(scores[0, 1:], scores[0, :-1])


# --- module ------------------------------------------------------------------


def test_module_1d_and_3d(device):
    q, k = torch.randn(2, 7, 4, 24, device=device), torch.randn(2, 7, 2, 24, device=device)
    m1 = rope.RoPE(24, max_len=16, backend="triton").to(device)
    cos, sin = rope.rope_table_1d(7, 24, device=device)
    for got, want in zip(m1(q, k), rope.rope_reference(q, k, cos, sin), strict=True):
        torch.testing.assert_close(got, want)
    assert "cos" not in m1.state_dict()
    q30, k30 = torch.randn(1, 30, 2, 24, device=device), torch.randn(1, 30, 2, 24, device=device)
    m3 = rope.RoPE(24, grid=(2, 3, 5), sections=(2, 5, 5), backend="triton").to(device)
    cos, sin = rope.rope_table_3d((2, 3, 5), 24, (2, 5, 5), device=device)
    for got, want in zip(m3(q30, k30), rope.rope_reference(q30, k30, cos, sin), strict=True):
        torch.testing.assert_close(got, want)


def test_module_tables_stay_fp32_when_the_model_is_cast():
    m = rope.RoPE(64, max_len=5000)
    cos = m.cos.clone()
    m.to(torch.bfloat16)
    assert m.cos.dtype == m.sin.dtype == torch.float32
    assert torch.equal(m.cos, cos)


# --- errors ------------------------------------------------------------------


def test_table_errors_name_the_values():
    with pytest.raises(ValueError, match="head_dim 7 must be a positive even number"):
        rope.rope_table_1d(4, 7)
    with pytest.raises(ValueError, match="head_dim 0 must be a positive even number"):
        rope.rope_table_3d((1, 2, 2), 0)
    with pytest.raises(ValueError, match=r"sections \(3, 3, 3\) .* sum to head_dim // 2 = 10"):
        rope.rope_table_3d((1, 2, 2), 20, (3, 3, 3))
    with pytest.raises(ValueError, match=r"sections \(-1, 6, 5\)"):
        rope.rope_table_3d((1, 2, 2), 20, (-1, 6, 5))
    with pytest.raises(ValueError, match=r"grid \(2, 0, 3\) must be three positive sizes"):
        rope.rope_table_3d((2, 0, 3), 20)
    with pytest.raises(ValueError, match=r"positions has shape \(2, 3\)"):
        rope.rope_table_1d(torch.zeros(2, 3), 8)


def test_shape_errors_name_the_shapes(device):
    q = torch.randn(2, 5, 4, 8, device=device)
    cos, sin = rope.rope_table_1d(5, 8, device=device)
    with pytest.raises(ValueError, match=r"q \(2, 5, 4, 8\) and k \(2, 6, 4, 8\) must agree"):
        rope.apply_rope(q, torch.randn(2, 6, 4, 8, device=device), cos, sin)
    with pytest.raises(ValueError, match=r"q has shape \(2, 5, 32\)"):
        rope.apply_rope(q.flatten(2), q, cos, sin)
    with pytest.raises(ValueError, match=r"head_dim 7 of q \(2, 5, 4, 7\) is odd"):
        rope.apply_rope(q[..., :7], q[..., :7], cos, sin)
    with pytest.raises(ValueError, match=r"cos has shape \(4, 4\); expected .* \(5, 4\)"):
        rope.apply_rope(q, q, cos[:4], sin)
    with pytest.raises(ValueError, match=r"but k is torch\.float16"):
        rope.apply_rope(q, q.half(), cos, sin)


def test_module_errors():
    with pytest.raises(ValueError, match=r"exactly one of max_len .* got max_len=None, grid=None"):
        rope.RoPE(64)
    with pytest.raises(ValueError, match="exactly one of max_len"):
        rope.RoPE(64, max_len=8, grid=(1, 2, 4))
    with pytest.raises(ValueError, match=r"sections \(10, 11, 11\) .* only with grid"):
        rope.RoPE(64, max_len=8, sections=(10, 11, 11))
    m = rope.RoPE(8, grid=(1, 2, 3))
    q = torch.randn(1, 7, 2, 8)
    with pytest.raises(ValueError, match=r"sequence length 7 .* table \(6 positions\)"):
        m(q, q)
