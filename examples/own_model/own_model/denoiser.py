"""A video-frame denoiser: each frame, with Gaussian noise added, is restored by a stack
of residual convolution blocks. Small, and it learns on stoker's synthetic AV set in a
few hundred steps on a CPU.

It follows stoker's model contract (stoker/model.py): a factory taking the data's shapes
and declared arguments; `forward(batch) -> (loss, metrics)`; `blocks()`, the units
stoker shards (FSDP2), recomputes and compiles; `init_weights()`; `flops_per_sample`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stoker.model import DataShapes, valid_mean


@dataclass
class Args:
    """`model.args`: validated by stoker, errors name `model.args.<field>`."""

    width: int = 32
    depth: int = 2
    noise: float = 0.2

    def __post_init__(self) -> None:
        if self.width < 1 or self.depth < 1:
            raise ValueError(f"width and depth must be >= 1, got {self.width}, {self.depth}")


def build(data: DataShapes, args: Args) -> Denoiser:
    if "video" not in data.modalities:
        raise ValueError(f"the denoiser needs video, data.modalities is {data.modalities}")
    return Denoiser(data, args)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(F.gelu(self.conv1(x)))


class Denoiser(nn.Module):
    def __init__(self, data: DataShapes, args: Args) -> None:
        super().__init__()
        self.args, self.data = args, data
        self.stem = nn.Conv2d(3, args.width, 3, padding=1)
        self.layers = nn.ModuleList(Block(args.width) for _ in range(args.depth))
        self.head = nn.Conv2d(args.width, 3, 3, padding=1)
        self.init_weights()

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, nonlinearity="linear")
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.head.weight)  # starts as the identity on the noisy input

    def forward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        video = batch["video"]  # uint8 [B, T, 3, H, W]
        frames = video.flatten(0, 1).float() / 127.5 - 1.0  # [B*T, 3, H, W] in [-1, 1]
        noise = _noise(frames, batch.get("generators"), video.shape[1])
        noisy = frames + self.args.noise * noise
        x = self.stem(noisy)
        for block in self.layers:
            x = block(x)
        restored = noisy + self.head(x)
        # One loss per clip, averaged over the clips stoker could decode (`valid`).
        per_clip = (restored - frames).square().reshape(video.shape[0], -1).mean(dim=1)
        return valid_mean(per_clip, batch), {"noisy_mse": F.mse_loss(noisy, frames).detach()}

    def flops_per_sample(self, batch: Any = None) -> float:
        """Training FLOPs of one clip of this batch's shape: 2 per multiply-add, forward
        and twice that backward."""
        if batch is not None:  # with data.buckets, clips differ from batch to batch
            _, t, _, h, w = batch["video"].shape
        else:
            t, (h, w) = self.data.frames, self.data.resolution
        c = self.args.width
        macs = h * w * 9 * (3 * c + 2 * c * c * self.args.depth + c * 3)
        return 3 * 2 * macs * t


def _noise(frames: torch.Tensor, generators: Any, per_sample: int) -> torch.Tensor:
    """Standard normal noise, drawn from each sample's generator when stoker gives them
    (the same noise whatever the number of ranks and restarts)."""
    if not generators:
        return torch.randn_like(frames)
    shape = (per_sample, *frames.shape[1:])
    return torch.cat([torch.randn(shape, device=frames.device, generator=g) for g in generators])
