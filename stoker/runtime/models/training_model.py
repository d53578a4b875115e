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


Rows = str
"""What a matmul weight multiplies per sample, by name in a model's token counts:
"sample" (once per sample), "tokens" (every token), or a part ("video", "audio")."""


def normal_init_(tensor: torch.Tensor, std: float) -> None:
    """nn.init.normal_, but a meta tensor (the model check and the planner build on the
    meta device) is left as it is: it holds no values, and torch's normal_ on meta
    imports torch._dynamo, 1.5 CPU-s on every `stoker run`, `submit` and `check`."""
    if not tensor.is_meta:
        nn.init.normal_(tensor, std=std)


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
    - `token_counts(batch)`: the tokens a sample of this batch's shape becomes, by
      part; FLOPs and tokens per sample follow from them, per batch shape (buckets).
    """

    blocks: nn.ModuleList
    _matmuls: tuple[tuple[int, Rows], ...] = ()
    _counts: dict[Rows, int] = {}  # noqa: RUF012 (replaced, never mutated)
    _dim = 0
    _depth = 0

    def _count_flops(
        self, matmuls: list[tuple[nn.Linear, Rows]], dim: int, counts: dict[Rows, int]
    ) -> None:
        """Record what the FLOPs formula needs, once the layers exist: every Linear
        with what it multiplies per sample; `counts`, the token counts of the data's
        (largest) shape, for flops_per_sample() without a batch."""
        self._matmuls = tuple((linear.weight.numel(), rows) for linear, rows in matmuls)
        self._dim, self._depth, self._counts = dim, len(self.blocks), dict(counts)

    def token_counts(self, batch: Batch) -> dict[Rows, int]:
        """{"sample": 1, "tokens": S, ...}: the rows each matmul multiplies for one
        sample of this batch's shape."""
        raise NotImplementedError

    def loss(self, batch: Batch, generator: Noise = None) -> torch.Tensor:
        """The training loss of one batch, an fp32 scalar. `generator` (on the
        batch's device; one, or one per sample) draws the noise where the loss
        needs any; None uses the global RNG of that device."""
        out: torch.Tensor = self(batch, generator)
        return out

    def init_weights(self) -> None:
        raise NotImplementedError

    def tokens_per_sample(self, batch: Batch | None = None) -> int:
        """The sequence length S the transformer sees per sample of this batch's shape
        (without a batch: of the data's largest shape)."""
        return self._counts_of(batch)["tokens"]

    def matmul_params(self) -> int:
        """Parameters in matmuls (N of stoker.runtime.models.flops)."""
        return sum(params for params, _ in self._matmuls)

    def flops_per_sample(self, batch: Batch | None = None) -> float:
        """Training FLOPs (forward + backward) of one sample of this batch's shape
        (without a batch: of the data's largest shape), by the formula of
        stoker.runtime.models.flops."""
        counts = self._counts_of(batch)
        return sum(matmul_flops(params, counts[rows]) for params, rows in self._matmuls) + (
            attention_flops(self._depth, self._dim, counts["tokens"])
        )

    def _counts_of(self, batch: Batch | None) -> dict[Rows, int]:
        return self._counts if batch is None else {"sample": 1, **self.token_counts(batch)}
