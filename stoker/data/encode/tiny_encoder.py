"""stoker's own small encoder (`--encoder stoker.data.tiny_encoder:build`): latents of
video and audio with no downloaded weights, for demos, tests and benchmarks.

Video [T, 3, H, W] uint8 -> [T, C, H/f, W/f]: each f x f patch of RGB scaled to
[-1, 1] is projected onto C fixed orthonormal directions (drawn from `seed`), as a
linear VAE's encoder would; audio [C, N] -> [A, N/hop]: each hop of samples onto A
directions. Deterministic and batch-independent, so equal inputs give byte-equal
latents in any batch, process or machine (float32 math; stored as `dtype`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _directions(rows: int, dims: int, seed: int) -> torch.Tensor:
    """`rows` orthonormal vectors of `dims` (rows <= dims), the same for a seed on any
    machine: QR of a float64 Gaussian matrix from torch's CPU generator."""
    generator = torch.Generator().manual_seed(seed)
    gaussian = torch.randn(dims, rows, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(gaussian)
    q = q * torch.sign(torch.diagonal(r))  # a unique sign per column
    basis: torch.Tensor = q.T.contiguous().to(torch.float32)
    return basis


class TinyAVEncoder(nn.Module):
    """The encoder (module docstring)."""

    video_basis: torch.Tensor
    audio_basis: torch.Tensor

    def __init__(
        self,
        *,
        channels: int = 8,
        factor: int = 4,
        audio_channels: int = 16,
        hop: int = 160,
        audio_in: int = 1,
        dtype: str = "float16",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if channels > 3 * factor * factor or audio_channels > hop * audio_in:
            raise ValueError("more latent channels than input values per patch")
        self.factor, self.hop, self.dtype = factor, hop, DTYPES[dtype]
        self.register_buffer("video_basis", _directions(channels, 3 * factor * factor, seed))
        self.register_buffer("audio_basis", _directions(audio_channels, hop * audio_in, seed + 1))

    @torch.inference_mode()
    def forward(self, batch: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        out = {}
        if "video" in batch:
            out["video"] = self.encode_video(batch["video"])
        if "audio" in batch:
            out["audio"] = self.encode_audio(batch["audio"])
        if not out:
            raise ValueError(f"the batch has {sorted(batch)}: no video or audio to encode")
        return out

    def encode_video(self, video: torch.Tensor) -> torch.Tensor:
        """[B, T, 3, H, W] uint8 -> [B, T, C, H/f, W/f]."""
        b, t, c, h, w = video.shape
        f = self.factor
        if h % f or w % f:
            raise ValueError(f"frames {h}x{w} do not divide by the encoder's factor {f}")
        x = video.float() / 127.5 - 1.0
        x = x.reshape(b, t, c, h // f, f, w // f, f).permute(0, 1, 3, 5, 2, 4, 6)
        x = x.reshape(b, t, h // f, w // f, c * f * f)
        z = x @ self.video_basis.T  # [B, T, h, w, C]
        return z.permute(0, 1, 4, 2, 3).contiguous().to(self.dtype)

    def encode_audio(self, audio: torch.Tensor) -> torch.Tensor:
        """[B, C, N] float -> [B, A, N/hop] (a shorter tail than a hop is dropped)."""
        b, c, n = audio.shape
        frames = n // self.hop
        if frames < 1 or c * self.hop != self.audio_basis.shape[1]:
            wants = self.audio_basis.shape[1] // self.hop
            raise ValueError(
                f"audio [{c}, {n}] does not fit the encoder: {wants} channel(s) of at least "
                f"{self.hop} samples"
            )
        x = audio[:, :, : frames * self.hop].float().reshape(b, c, frames, self.hop)
        x = x.permute(0, 2, 1, 3).reshape(b, frames, c * self.hop)
        z = x @ self.audio_basis.T  # [B, frames, A]
        return z.transpose(1, 2).contiguous().to(self.dtype)


def build(**kwargs: Any) -> TinyAVEncoder:
    """The factory `--encoder stoker.data.tiny_encoder:build` names; --args channels=8
    factor=4 audio_channels=16 hop=160 audio_in=1 dtype=float16 seed=0."""
    return TinyAVEncoder(**kwargs)


build.version = "1"  # type: ignore[attr-defined]  # part of the encoder's identity
