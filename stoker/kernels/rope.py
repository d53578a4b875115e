"""Rotary position embedding (RoPE) for attention q and k, with 1D positions
(text, flattened patches) or 3D (T, H, W) positions (video tokens).

Convention: half-split pairs, as GPT-NeoX and LLaMA in Hugging Face
(`rotate_half`): channel i pairs with channel i + D/2, and pair i turns by
angle a_i = position * theta^(-2i/D):
    out_i       = x_i * cos(a_i) - x_{i+D/2} * sin(a_i)
    out_{i+D/2} = x_{i+D/2} * cos(a_i) + x_i * sin(a_i)
Checkpoints trained with interleaved pairs (d_2i, d_2i+1; Meta LLaMA, Wan)
need their q/k projection rows permuted to use it.

Layout: q [B, S, Hq, D] and k [B, S, Hk, D] (Hk may differ from Hq: grouped-
query attention), cos and sin [S, D/2] fp32, shared over batch and heads. q
and k may be strided views (split out of one fused qkv projection); the
kernel reads them in place. One Triton kernel (stoker/kernels/ops/rope.py)
rotates q and k in one launch, behind the custom op pair `stoker::rope_fwd` /
`stoker::rope_bwd`; `rope_reference` is the pure-torch path.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from stoker.kernels.backend import Backend, resolve
from stoker.kernels.dispatch import apply_function, compute_dtype, direct_call, needs_grad

# --- tables ------------------------------------------------------------------


def rope_table_1d(
    positions_or_length: int | torch.Tensor,
    head_dim: int,
    theta: float = 10000.0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each fp32 [S, head_dim // 2], for positions 0..length-1 or
    for a 1-D tensor of (possibly fractional) positions. Row s, column i is
    the angle positions[s] * theta^(-2i / head_dim).

    The angles and their cos/sin are computed in fp64 on the CPU and rounded
    once to fp32: at position 10^4 an fp32 angle is already off by 5e-4 rad."""
    half = _half(head_dim)
    _check_theta(theta)
    if isinstance(positions_or_length, torch.Tensor):
        positions = positions_or_length
        if positions.dim() != 1:
            raise ValueError(
                f"positions has shape {tuple(positions.shape)}; expected one position per "
                "token, a 1-D tensor (S,)"
            )
        device = positions.device if device is None else device
        pos = positions.detach().to("cpu", torch.float64)
    else:
        if positions_or_length < 0:
            raise ValueError(f"sequence length {positions_or_length} is negative")
        pos = torch.arange(positions_or_length, dtype=torch.float64)
    cos, sin = _table(pos, half, theta)
    return cos.to(device), sin.to(device)


def rope_table_3d(
    grid: tuple[int, int, int],
    head_dim: int,
    sections: tuple[int, int, int] | None = None,
    theta: float = 10000.0,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each fp32 [T*H*W, head_dim // 2], for video tokens laid out
    t-major, then h, then w (token s = (t * H + h) * W + w), so that the first
    T'*H*W rows are the table of a clip of T' < T frames.

    The head_dim // 2 rotary pairs are split into three consecutive sections
    (t, h, w) of `sections` pairs each; section j is a 1D RoPE of head_dim
    2 * sections[j] over that token's t, h or w index (each axis gets the
    whole frequency range, as in Wan and HunyuanVideo, not a third of one
    spectrum). Default sections: `default_sections(head_dim)`."""
    _half(head_dim)
    _check_theta(theta)
    frames, height, width = _check_grid(grid)
    split = default_sections(head_dim) if sections is None else _check_sections(sections, head_dim)
    token = torch.arange(frames * height * width)
    index = (token // (height * width), token // width % height, token % width)
    cos, sin = [], []
    for size, pairs, at in zip((frames, height, width), split, index, strict=True):
        # Each axis's table is small (size x pairs): build it, then gather its
        # rows per token, so the section is exactly rope_table_1d(size, 2 * pairs).
        axis_cos, axis_sin = _table(torch.arange(size, dtype=torch.float64), pairs, theta)
        cos.append(axis_cos[at])
        sin.append(axis_sin[at])
    return torch.cat(cos, dim=1).to(device), torch.cat(sin, dim=1).to(device)


def default_sections(head_dim: int) -> tuple[int, int, int]:
    """The (t, h, w) split of head_dim // 2 pairs, as equal as possible: h and
    w always get the same number (round(pairs / 3)), so swapping an image's
    axes swaps their sections; t gets the rest, one more or one fewer.
    E.g. head_dim 64 -> (10, 11, 11), 128 -> (22, 21, 21), 96 -> (16, 16, 16)."""
    half = _half(head_dim)
    spatial = (half + 1) // 3
    return half - 2 * spatial, spatial, spatial


def _table(pos: torch.Tensor, pairs: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (cos, sin) [len(pos), pairs] of the fp64 angles pos * theta^(-i / pairs)."""
    exponent = torch.arange(pairs, dtype=torch.float64) / max(pairs, 1)
    angles = pos[:, None] * theta ** -exponent[None, :]
    return angles.cos().float(), angles.sin().float()


def _half(head_dim: int) -> int:
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(
            f"head_dim {head_dim} must be a positive even number: RoPE rotates pairs of "
            "channels (d_i, d_i+D/2)"
        )
    return head_dim // 2


def _check_theta(theta: float) -> None:
    if not theta > 0:
        raise ValueError(f"theta {theta} must be positive (the usual base is 10000)")


def _check_grid(grid: tuple[int, ...]) -> tuple[int, int, int]:
    if len(grid) != 3 or any(n < 1 for n in grid):
        raise ValueError(
            f"grid {tuple(grid)} must be three positive sizes (T, H, W): frames, and "
            "the height and width in patches"
        )
    return grid[0], grid[1], grid[2]


def _check_sections(sections: tuple[int, ...], head_dim: int) -> tuple[int, int, int]:
    half = head_dim // 2
    if len(sections) != 3 or any(n < 0 for n in sections) or sum(sections) != half:
        raise ValueError(
            f"sections {tuple(sections)} must be three pair counts (t, h, w) >= 0 that sum "
            f"to head_dim // 2 = {half} for head_dim {head_dim}, "
            f"e.g. {default_sections(head_dim)}"
        )
    return sections[0], sections[1], sections[2]


# --- reference ---------------------------------------------------------------


def rope_reference(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q_rot, k_rot) in pure torch: fp32 inside (fp64 for fp64), one rounding
    to q's dtype at the end, as the Triton kernel does."""
    acc = compute_dtype(q.dtype)
    # [S, D/2] -> [S, 1, D/2]: broadcast over batch and heads of [B, S, H, D/2].
    c, s = cos.to(acc)[:, None, :], sin.to(acc)[:, None, :]
    return _rotate(q, c, s, q.dtype), _rotate(k, c, s, q.dtype)


def _rotate(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    x1, x2 = x.to(cos.dtype).chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(dtype)


# --- custom ops (what torch.compile sees) -------------------------------------


@torch.library.custom_op("stoker::rope_fwd", mutates_args=())
def rope_fwd(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton forward: (q_out, k_out), contiguous [B, S, H, D]."""
    from stoker.kernels.ops import rope as ops

    return ops.rope_fwd(q, k, cos, sin)


@rope_fwd.register_fake
def _rope_fwd_fake(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape)


@torch.library.custom_op("stoker::rope_bwd", mutates_args=())
def rope_bwd(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton backward: (dq_in, dk_in), the rotation by -angle. cos and sin
    get no gradient: they are tables."""
    from stoker.kernels.ops import rope as ops

    return ops.rope_bwd(dq, dk, cos, sin)


@rope_bwd.register_fake
def _rope_bwd_fake(
    dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    return dq.new_empty(dq.shape), dk.new_empty(dk.shape)


# --- autograd ----------------------------------------------------------------


class RoPEFunction(torch.autograd.Function):
    """Triton RoPE on q [B, S, Hq, D] and k [B, S, Hk, D] with cos, sin
    [S, D/2]. Returns (q_rot, k_rot), contiguous."""

    @staticmethod
    def forward(
        ctx: torch.autograd.function.FunctionCtx,
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        fwd = ops_rope_fwd if direct_call(q) else rope_fwd
        q_out, k_out = fwd(q, k, cos, sin)
        ctx.save_for_backward(cos, sin)
        return q_out, k_out

    @staticmethod
    def backward(
        ctx: torch.autograd.function.FunctionCtx, dq: torch.Tensor, dk: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        cos, sin = ctx.saved_tensors  # type: ignore[attr-defined]
        # The launcher reads dq / dk through their strides: a gradient that
        # arrives as a transposed view ([B, H, S, D] attention) is not copied.
        bwd = ops_rope_bwd if direct_call(dq) else rope_bwd
        dq_in, dk_in = bwd(dq, dk, cos, sin)
        return (
            dq_in if needs_grad(ctx, 0) else None,
            dk_in if needs_grad(ctx, 1) else None,
            None,
            None,
        )


def ops_rope_fwd(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton forward without the custom-op dispatch: eager calls on
    plain tensors take this path (see direct_call)."""
    from stoker.kernels.ops import rope as ops

    return ops.rope_fwd(*args)


def ops_rope_bwd(*args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from stoker.kernels.ops import rope as ops

    return ops.rope_bwd(*args)


# --- public functions ----------------------------------------------------------


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    backend: Backend | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by the position angles in cos / sin. q: [B, S, Hq, D],
    k: [B, S, Hk, D] (any batch / sequence / head strides); cos, sin:
    [S, D/2] from rope_table_1d / rope_table_3d."""
    _check_qk(q, k)
    _check_tables(q, cos, sin)
    if resolve(backend, q) == "reference":
        return rope_reference(q, k, cos, sin)
    out: tuple[torch.Tensor, torch.Tensor] = apply_function(RoPEFunction, q, k, cos, sin)
    return out


def _check_qk(q: torch.Tensor, k: torch.Tensor) -> None:
    """q and k as [B, S, H, D] that agree in B, S, D and dtype, with D even, or
    a ValueError that names the shapes."""
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q has shape {tuple(q.shape)} and k {tuple(k.shape)}; RoPE takes "
            "[batch, seq, heads, head_dim] (transpose [B, H, S, D] with .transpose(1, 2))"
        )
    if q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree in batch, seq and "
            "head_dim (only the head counts may differ)"
        )
    if q.shape[3] % 2:
        raise ValueError(
            f"head_dim {q.shape[3]} of q {tuple(q.shape)} is odd; RoPE rotates pairs of "
            "channels, so it must be even"
        )
    if q.dtype != k.dtype or q.device != k.device:
        raise ValueError(
            f"q is {q.dtype} on {q.device} but k is {k.dtype} on {k.device}; use one dtype "
            "and device"
        )


def _check_tables(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    expected = (q.shape[1], q.shape[3] // 2)
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != expected:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)}; expected (seq, head_dim // 2) = "
                f"{expected} for q of shape {tuple(q.shape)} (slice the table to its "
                "first seq rows)"
            )
        if t.device != q.device:
            raise ValueError(
                f"{name} is on {t.device} but q is on {q.device}; move the tables to q's device"
            )


# --- modules -----------------------------------------------------------------


class RoPE(nn.Module):
    """RoPE with its cos / sin tables held as (non-persistent) buffers, for 1D
    positions 0..max_len-1 or for a (T, H, W) video grid. forward(q, k) uses
    the first S rows of the table, S = q.shape[1].

    The tables stay fp32 when the model is cast (model.to(torch.bfloat16)):
    rounding the angles of far positions to bf16 would move them."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        *,
        grid: tuple[int, int, int] | None = None,
        max_len: int | None = None,
        sections: tuple[int, int, int] | None = None,
        theta: float = 10000.0,
        backend: Backend | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if (grid is None) == (max_len is None):
            raise ValueError(
                f"RoPE takes exactly one of max_len (1D positions) or grid=(T, H, W) "
                f"(video tokens); got max_len={max_len}, grid={grid}"
            )
        if sections is not None and grid is None:
            raise ValueError(
                f"sections {sections} split the pairs among t, h and w; they apply only "
                "with grid=(T, H, W), not with max_len"
            )
        self.head_dim, self.grid, self.max_len = head_dim, grid, max_len
        self.sections, self.theta, self.backend = sections, theta, backend
        cos, sin = self._tables(device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device: torch.device | str | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.grid is not None:
            return rope_table_3d(self.grid, self.head_dim, self.sections, self.theta, device)
        assert self.max_len is not None
        return rope_table_1d(self.max_len, self.head_dim, self.theta, device)

    def reset_parameters(self) -> None:
        """Rebuild the tables where the buffers are (after to_empty() from meta)."""
        self.cos, self.sin = self._tables(self.cos.device)

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> RoPE:
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        if self.cos.dtype != torch.float32:
            self.reset_parameters()
        return self

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _check_qk(q, k)
        seq, table = q.shape[1], self.cos.shape[0]
        if seq > table:
            raise ValueError(
                f"sequence length {seq} of q {tuple(q.shape)} is longer than the RoPE table "
                f"({table} positions); build RoPE with "
                + (f"max_len >= {seq}" if self.grid is None else f"a grid of >= {seq} tokens")
            )
        return apply_rope(q, k, self.cos[:seq], self.sin[:seq], backend=self.backend)

    def extra_repr(self) -> str:
        where = f"max_len={self.max_len}" if self.grid is None else f"grid={self.grid}"
        sections = "" if self.grid is None else f", sections={self.sections or 'default'}"
        return f"{self.head_dim}, {where}{sections}, theta={self.theta}"
