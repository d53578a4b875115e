"""An exponential moving average of the model's weights (`train.ema_decay`).

After every optimizer step that was taken (a skipped non-finite step leaves it as is):

    ema <- decay * ema + (1 - decay) * weight        (torch.lerp, in the weight's dtype)

The average has one tensor per trainable parameter, a clone of it: under FSDP2 a
DTensor sharded as the parameter is, so it costs each rank its shard's bytes and no
communication. It is saved in checkpoints under `ema.<fqn>` (the model's plain
FQNs, as `model.<fqn>`), resharded by DCP on load, and so resumes bit for bit.
Buffers are not averaged: a model with the average's weights takes its buffers
from the model.

`applied(model)` swaps the average into the model for sampling and swaps the
trained weights back afterwards (one extra copy of this rank's weights meanwhile).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

EMA_KEY = "ema"
# Wrapper segments in parameter names that DCP's get_state_dict strips as well:
# torch.compile, activation checkpointing, FSDP1.
WRAPPER_SEGMENTS = ("_orig_mod.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module.")


def plain_fqn(name: str) -> str:
    """A parameter's name without wrapper segments: the FQN checkpoints key it by."""
    for segment in WRAPPER_SEGMENTS:
        name = name.replace(segment, "")
    return name


class EMA:
    """The average of `model`'s trainable parameters with `decay` (0 < decay < 1)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"EMA decay {decay!r} must be between 0 and 1, e.g. 0.999")
        self.decay = decay
        self._params = [
            (plain_fqn(name), p) for name, p in model.named_parameters() if p.requires_grad
        ]
        self.shadow: dict[str, torch.Tensor] = {}
        self.reset()

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average at the model's current weights (a fresh run, or a resume
        from a checkpoint saved without one)."""
        self.shadow = {name: p.detach().clone() for name, p in self._params}

    @torch.no_grad()
    def update(self) -> None:
        """One step of the average towards the current weights."""
        weight = 1.0 - self.decay
        for name, p in self._params:
            self.shadow[name].lerp_(p.detach(), weight)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The average by plain FQN: saved as is, and loaded into in place."""
        return self.shadow

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The model holds the average's weights inside the block, its own after."""
        with torch.no_grad():
            trained = [p.detach().clone() for _, p in self._params]
            for name, p in self._params:
                p.copy_(self.shadow[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for (_, p), saved in zip(self._params, trained, strict=True):
                    p.copy_(saved)
