"""Size presets, the values of `model.size`, for each architecture.

Widths follow the usual ladder (DiT / LLaMA): head dim 32 for tiny, 64 for
small and base, 64 or 128 above; the SwiGLU hidden size is 8/3 of the width
rounded up to a multiple of 64 (two thirds of a 4x MLP's parameters in each of
its three matrices, so the MLP costs what a 4x GELU MLP costs).

av_dit blocks carry adaLN modulation (a dim -> 6*dim linear per block, applied
once per sample), so at equal width and depth they hold 60% more parameters
than audio_ar blocks; the 1b av_dit is therefore shallower (14 blocks) than the
1b audio_ar (20). Parameter counts per preset are in docs/runtime.md and are
checked by tests/runtime/test_models.py.

Video patches work in pixel space (no autoencoder): a patch of 2 frames x 8 x 8
pixels x 3 colours is 384 values. Large and 1b take 16 x 16 patches, so a
256 x 256 clip of 16 frames is 8 x 16 x 16 = 2048 video tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SizeName = Literal["tiny", "small", "base", "large", "1b"]
SIZE_NAMES: tuple[SizeName, ...] = ("tiny", "small", "base", "large", "1b")


def swiglu_hidden(dim: int, multiple: int = 64) -> int:
    """8/3 of dim rounded up to a multiple of `multiple` (LLaMA's rule)."""
    return -(-(8 * dim) // (3 * multiple)) * multiple


@dataclass(frozen=True)
class AVDiTSize:
    """One av_dit preset."""

    dim: int
    """Model width (token embedding size)."""
    depth: int
    """Number of transformer blocks."""
    heads: int
    """Attention heads; dim // heads is the head dim (even, for RoPE)."""
    mlp_hidden: int
    """SwiGLU hidden size."""
    video_patch: tuple[int, int, int]
    """Video patch (frames, height, width) in pixels: one token each."""
    audio_patch: int
    """Audio samples per token (times the channels: one token holds all channels)."""


@dataclass(frozen=True)
class AudioARSize:
    """One audio_ar preset."""

    dim: int
    """Model width."""
    depth: int
    """Number of transformer blocks."""
    heads: int
    """Attention heads; dim // heads is the head dim (even, for RoPE)."""
    mlp_hidden: int
    """SwiGLU hidden size."""
    max_tokens: int
    """Longest sequence: one token per audio sample (1024 is 64 ms at 16 kHz)."""


AV_DIT_SIZES: dict[SizeName, AVDiTSize] = {
    "tiny": AVDiTSize(128, 4, 4, swiglu_hidden(128), (2, 8, 8), 400),
    "small": AVDiTSize(384, 12, 6, swiglu_hidden(384), (2, 8, 8), 400),
    "base": AVDiTSize(768, 12, 12, swiglu_hidden(768), (2, 8, 8), 400),
    "large": AVDiTSize(1024, 24, 16, swiglu_hidden(1024), (2, 16, 16), 800),
    "1b": AVDiTSize(2048, 14, 16, swiglu_hidden(2048), (2, 16, 16), 800),
}

AUDIO_AR_SIZES: dict[SizeName, AudioARSize] = {
    "tiny": AudioARSize(128, 4, 4, swiglu_hidden(128), 1024),
    "small": AudioARSize(384, 12, 6, swiglu_hidden(384), 2048),
    "base": AudioARSize(768, 12, 12, swiglu_hidden(768), 4096),
    "large": AudioARSize(1024, 24, 16, swiglu_hidden(1024), 8192),
    "1b": AudioARSize(2048, 20, 16, swiglu_hidden(2048), 8192),
}


def av_dit_size(size: str) -> AVDiTSize:
    """The av_dit preset named `size`, or a ValueError listing the names."""
    if size not in AV_DIT_SIZES:
        raise ValueError(f"model.size {size!r} is not one of {', '.join(SIZE_NAMES)}")
    return AV_DIT_SIZES[size]


def audio_ar_size(size: str) -> AudioARSize:
    """The audio_ar preset named `size`, or a ValueError listing the names."""
    if size not in AUDIO_AR_SIZES:
        raise ValueError(f"model.size {size!r} is not one of {', '.join(SIZE_NAMES)}")
    return AUDIO_AR_SIZES[size]
