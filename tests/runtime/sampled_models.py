"""Helpers of the sampling tests: models whose every weight matters, and seeded
generators on the CPU."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

from stoker.runtime.sampling.draw import seeded_generators

M = TypeVar("M", bound=nn.Module)


def scrambled(model: M) -> M:
    """Random values in every parameter, the zero-initialised ones included: at
    initialisation the av_dit's v is exactly 0 and the samples would be the noise."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.1 + (param.dim() == 1))
    return model


def generators(*seeds: int) -> list[torch.Generator]:
    return seeded_generators(seeds, torch.device("cpu"))
