"""Cutting video and audio into tokens, and putting them back together.

Video [B, T, C, H, W] -> [B, (T/pt)(H/ph)(W/pw), pt*ph*pw*C], tokens t-major,
then h, then w: the order of stoker.kernels.rope_table_3d's rows. Audio
[B, C, N] -> [B, N/p, C*p]: one token holds p consecutive samples of every
channel. Both are reshapes and one permute; unpatchify is their exact inverse.
"""

from __future__ import annotations

import torch


def patchify_video(video: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """[B, T, C, H, W] -> [B, tokens, pt*ph*pw*C]; T, H, W must divide by the patch."""
    b, t, c, h, w = video.shape
    pt, ph, pw = patch
    x = video.reshape(b, t // pt, pt, c, h // ph, ph, w // pw, pw)
    # -> [B, T', H', W', pt, ph, pw, C]
    x = x.permute(0, 1, 4, 6, 2, 5, 7, 3)
    return x.reshape(b, (t // pt) * (h // ph) * (w // pw), pt * ph * pw * c)


def unpatchify_video(
    tokens: torch.Tensor, patch: tuple[int, int, int], shape: tuple[int, int, int, int]
) -> torch.Tensor:
    """[B, tokens, pt*ph*pw*C] -> [B, T, C, H, W], with shape = (T, C, H, W)."""
    b = tokens.shape[0]
    t, c, h, w = shape
    pt, ph, pw = patch
    x = tokens.reshape(b, t // pt, h // ph, w // pw, pt, ph, pw, c)
    # -> [B, T', pt, C, H', ph, W', pw]
    x = x.permute(0, 1, 4, 7, 2, 5, 3, 6)
    return x.reshape(b, t, c, h, w)


def patchify_audio(audio: torch.Tensor, patch: int) -> torch.Tensor:
    """[B, C, N] -> [B, N/patch, C*patch]; N must divide by the patch."""
    b, c, n = audio.shape
    return audio.reshape(b, c, n // patch, patch).transpose(1, 2).reshape(b, n // patch, c * patch)


def unpatchify_audio(tokens: torch.Tensor, patch: int, channels: int) -> torch.Tensor:
    """[B, N/patch, C*patch] -> [B, C, N]."""
    b, count, _ = tokens.shape
    return tokens.reshape(b, count, channels, patch).transpose(1, 2).reshape(b, channels, -1)
