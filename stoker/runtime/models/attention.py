"""Multi-head self-attention with RoPE, shared by both models.

q, k and v come out of one fused projection; RoPE (stoker.kernels.apply_rope)
rotates q and k in their [B, S, heads, Dh] layout, as strided views of the
fused output, so the kernel reads them in place. Attention itself is
stoker.model.attention: torch's scaled_dot_product_attention (FlashAttention on GPUs),
or with context parallelism the attention over every CP rank's tokens
(context_parallel.py); both take [B, heads, S, Dh]: the transposes are views, not copies.
"""

from __future__ import annotations

import torch
from torch import nn

from stoker.kernels import RMSNorm, apply_rope
from stoker.model import attention


class SelfAttention(nn.Module):
    """Self-attention over [B, S, dim] with RoPE tables cos, sin [S, Dh/2] (with context
    parallelism: this rank's S tokens and their rows).

    qk_norm: RMSNorm over each head's q and k before RoPE (keeps attention
    logits bounded in long or large runs, as in SD3 and Wan)."""

    def __init__(self, dim: int, heads: int, *, causal: bool, qk_norm: bool) -> None:
        super().__init__()
        if dim % heads or (dim // heads) % 2:
            raise ValueError(
                f"dim {dim} must split into {heads} heads of an even size (RoPE rotates "
                "pairs of channels); choose heads dividing dim into an even head dim"
            )
        self.heads, self.head_dim, self.causal = heads, dim // heads, causal
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.q_norm = RMSNorm(self.head_dim) if qk_norm else None
        self.k_norm = RMSNorm(self.head_dim) if qk_norm else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, self.heads, self.head_dim).unbind(2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, k, cos, sin)
        out = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=self.causal)
        projected: torch.Tensor = self.out(out.transpose(1, 2).reshape(batch, seq, dim))
        return projected
