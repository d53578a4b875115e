"""Batches shaped like the data loader's, made with torch: random ones for shape
and FLOP checks, and a learnable synthetic set (a bright square moving over a
dark background, with a tone whose pitch follows its height)."""

from __future__ import annotations

import math

import torch

from stoker.config import DataConfig
from stoker.runtime.models import clip_frames, clip_samples


def data_config(**fields: object) -> DataConfig:
    return DataConfig.model_validate(fields)


def random_batch(data: DataConfig, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Uniform noise in the loader's dtypes and ranges, plus a key models ignore."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {"key": torch.arange(batch)}
    if "video" in data.modalities:
        shape = (batch, clip_frames(data), 3, *data.resolution)
        out["video"] = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    if "audio" in data.modalities:
        shape = (batch, data.channels, clip_samples(data))
        out["audio"] = torch.rand(shape, generator=gen) * 2 - 1
    return out


def moving_square_batch(data: DataConfig, batch: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Each sample: a square of a random colour crossing the frame at a random
    height, on a dark background; a sine tone (random phase) whose pitch is set
    by the square's height, the same in every channel."""
    gen = torch.Generator().manual_seed(seed)
    frames, (height, width) = clip_frames(data), data.resolution
    samples = clip_samples(data)
    side = max(2, height // 4)
    video = torch.full((batch, frames, 3, height, width), 20, dtype=torch.uint8)
    audio = torch.zeros(batch, data.channels, samples)
    time = torch.arange(samples) / data.sample_rate
    for i in range(batch):
        row = int(torch.randint(0, height - side + 1, (), generator=gen))
        colour = torch.randint(128, 256, (3, 1, 1), generator=gen).to(torch.uint8)
        for f in range(frames):
            col = (f * width // max(frames, 1)) % (width - side + 1)
            video[i, f, :, row : row + side, col : col + side] = colour
        pitch = 200.0 * 2 ** (3 * (1 - row / height))
        phase = float(torch.rand((), generator=gen)) * 2 * math.pi
        audio[i, :] = 0.5 * torch.sin(2 * math.pi * pitch * time + phase)
    out: dict[str, torch.Tensor] = {}
    if "video" in data.modalities:
        out["video"] = video
    if "audio" in data.modalities:
        out["audio"] = audio
    return out
