"""What the training runtime needs of a model: the base class of both models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from stoker.runtime.models.flops import attention_flops, matmul_flops

Batch = Mapping[str, Any]
"""A batch from the data loader: "video" uint8 [B, T, 3, H, W], "audio" float32
[B, C, N], "generators", and keys a model ignores ("text", "meta", ...): the
contract of stoker/model.py."""
Noise = torch.Generator | Sequence[torch.Generator] | None
"""What draws a loss's noise: one generator for the batch, one per sample, or
None (the global RNG of the batch's device)."""


class TrainingModel(nn.Module):
    """A model the runtime can shard, checkpoint, compile and measure.

    - `blocks`: the transformer blocks, the units of FSDP2 sharding, activation
      checkpointing and torch.compile; all alike, so one compiled graph serves all.
    - `forward(batch, generator)` returns the training loss, and `loss` calls it
      through `__call__`: FSDP2 gathers the root's parameters (embeddings,
      head) in a forward pre-hook, which a plain method call would skip.
    - `init_weights()` (re)initialises every parameter and rebuilds the
      non-persistent buffers in place: after building on the meta device and
      `to_empty(device=...)`, or on parameters already sharded by FSDP2.
    """

    blocks: nn.ModuleList
    _tokens = 0
    _matmul_params = 0
    _flops_per_sample = 0.0

    def _count_flops(self, tokens: int, matmuls: list[tuple[nn.Linear, int]], dim: int) -> None:
        """Record S, N and the FLOPs per sample, once the layers exist.
        `matmuls`: every Linear with the rows it multiplies per sample."""
        self._tokens = tokens
        self._matmul_params = sum(linear.weight.numel() for linear, _ in matmuls)
        self._flops_per_sample = sum(
            matmul_flops(linear.weight.numel(), rows) for linear, rows in matmuls
        ) + attention_flops(len(self.blocks), dim, tokens)

    def loss(self, batch: Batch, generator: Noise = None) -> torch.Tensor:
        """The training loss of one batch, an fp32 scalar. `generator` (on the
        batch's device; one, or one per sample) draws the noise where the loss
        needs any; None uses the global RNG of that device."""
        out: torch.Tensor = self(batch, generator)
        return out

    def init_weights(self) -> None:
        raise NotImplementedError

    def tokens_per_sample(self) -> int:
        """The sequence length S the transformer sees per sample."""
        return self._tokens

    def matmul_params(self) -> int:
        """Parameters in matmuls (N of stoker.runtime.models.flops)."""
        return self._matmul_params

    def flops_per_sample(self, batch: Batch | None = None) -> float:
        """Training FLOPs (forward + backward) of one sample, by the formula
        of stoker.runtime.models.flops."""
        return self._flops_per_sample
