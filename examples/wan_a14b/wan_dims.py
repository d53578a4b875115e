"""A model with Wan 2.2 A14B's transformer dimensions, for `stoker plan`: 40 blocks of
width 5120 with 40 heads and a 13,824-wide MLP, over 720p clips cut into patches of
4 frames x 16 x 16 pixels (Wan's VAE, 4 x 8 x 8, then its patch, 1 x 2 x 2): 84 frames
of 720 x 1280 make 21 x 45 x 80 = 75,600 tokens a clip.

Written as docs/bring-your-own.md writes a model for long sequences (stoker.model's
attention, token_slice and cp_sum), so the planner weighs context parallelism for it.
It stands for Wan's sizes, not its architecture (no text cross-attention, no VAE, one
expert of the two): planned on fake tensors, it is never trained here.

    cd examples/wan_a14b && PYTHONPATH=. stoker plan experiment.yaml --gpu H100
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from stoker.model import DataShapes, attention, cp_sum, token_slice, valid_mean

PATCH = (4, 16, 16)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(b, s, 3, self.heads, w // self.heads).unbind(2)
        mixed = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + self.out(mixed.transpose(1, 2).reshape(b, s, w))
        out: torch.Tensor = x + self.mlp(self.mlp_norm(x))
        return out


class WanLike(nn.Module):
    def __init__(self, dim: int, depth: int, heads: int, ffn: int) -> None:
        super().__init__()
        values = 3 * PATCH[0] * PATCH[1] * PATCH[2]
        self.dim, self.depth = dim, depth
        self.embed, self.head = nn.Linear(values, dim), nn.Linear(dim, values)
        self.layers = nn.ModuleList(Block(dim, heads, ffn) for _ in range(depth))

    def blocks(self) -> nn.ModuleList:
        return self.layers

    def tokens(self, video: torch.Tensor) -> torch.Tensor:
        """[B, T, 3, H, W] uint8 -> [B, tokens, 3 x 4 x 16 x 16] in [-1, 1]."""
        b, t, c, h, w = video.shape
        pt, ph, pw = PATCH
        x = video.float().div(127.5).sub(1.0)
        x = x.view(b, t // pt, pt, c, h // ph, ph, w // pw, pw).permute(0, 1, 4, 6, 2, 3, 5, 7)
        return x.reshape(b, (t // pt) * (h // ph) * (w // pw), pt * c * ph * pw)

    def forward(self, batch: dict[str, Any]) -> torch.Tensor:
        clean = self.tokens(batch["video"])
        noise = torch.randn_like(clean)  # drawn whole, then cut (every CP rank alike)
        share = token_slice(clean.shape[1])
        x = self.embed((clean + noise)[:, share])
        for layer in self.layers:
            x = layer(x)
        squared = (self.head(x) - noise[:, share]).square().sum(dim=(1, 2))
        return valid_mean(cp_sum(squared) / noise[0].numel(), batch)

    def flops_per_sample(self, batch: dict[str, Any]) -> float:
        tokens = self.tokens(batch["video"][:1]).shape[1]
        matmul = sum(p.numel() for n, p in self.named_parameters() if n.endswith("weight"))
        return 6.0 * matmul * tokens + 12.0 * self.depth * self.dim * tokens**2


def build(
    data: DataShapes, dim: int = 5120, depth: int = 40, heads: int = 40, ffn: int = 13824
) -> WanLike:
    return WanLike(dim, depth, heads, ffn)
