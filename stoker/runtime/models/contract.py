"""The trainer's side of the model contract (stoker/model.py): what it calls on any
model, built-in or a user's, with the optional parts optional.

- `block_slots`: where each block sits (its parent and attribute), so that activation
  checkpointing and torch.compile can wrap it in place and FSDP2 shard it;
- `loss_and_metrics`: forward through `__call__` (FSDP2's hooks), the loss checked to
  be a scalar, the model's own metrics beside it;
- `flops_per_sample`, `tokens_per_sample`: for MFU and tokens/s, when the model says;
  `SampleCosts` asks them once per batch shape (data.buckets: shapes vary by batch).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from stoker.errors import StokerError

Slot = tuple[nn.Module, str]


def model_class_name(model: nn.Module) -> str:
    """The user's class of `model`, as they wrote it: FSDP2's `fully_shard` swaps a
    module's class for a subclass named `FSDP<Name>`, a name the user never wrote."""
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if not issubclass(cls, FSDPModule):
            return cls.__name__
    return type(model).__name__


def blocks_of(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: `blocks()` or a `blocks` ModuleList; [] without."""
    blocks: Any = getattr(model, "blocks", None)
    if blocks is None:
        return []
    if callable(blocks) and not isinstance(blocks, nn.Module):
        blocks = blocks()
    found = list(blocks)
    for block in found:
        if not isinstance(block, nn.Module):
            raise StokerError(
                f"{model_class_name(model)}.blocks() gave a {type(block).__name__}, "
                "not an nn.Module",
                fix="return the model's repeated submodules (stoker/model.py)",
            )
    return found


def block_slots(model: nn.Module) -> list[Slot]:
    """(parent, attribute name) of each block, in order: `setattr(parent, name, w)`
    replaces a block by a wrapper of it."""
    blocks = blocks_of(model)
    names = {id(module): name for name, module in model.named_modules() if name}
    slots = []
    for block in blocks:
        name = names.get(id(block))
        if name is None:
            raise StokerError(
                f"{model_class_name(model)}.blocks() gave a module that is not a submodule of "
                "the model",
                fix="return modules the model holds as attributes (or in a ModuleList)",
            )
        parent_name, _, attr = name.rpartition(".")
        slots.append((model.get_submodule(parent_name) if parent_name else model, attr))
    return slots


def loss_and_metrics(
    model: nn.Module, batch: Mapping[str, Any]
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The batch's loss (a scalar tensor) and the model's metrics {name: scalar}."""
    out = model(batch)
    metrics: Mapping[str, Any] = {}
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        out, metrics = out
    if not isinstance(out, torch.Tensor) or out.dim() != 0:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise StokerError(
            f"{model_class_name(model)}.forward(batch) returned {shape}, not a scalar loss",
            fix="return the batch's loss as a 0-dim tensor (e.g. losses.mean()), or "
            "(loss, {name: value}) for metrics beside it",
        )
    return out, {str(k): v for k, v in metrics.items()}


def flops_per_sample(model: nn.Module, batch: Mapping[str, Any]) -> float | None:
    """Training FLOPs of one sample of this batch's shape, when the model can say (MFU)."""
    method = getattr(model, "flops_per_sample", None)
    if not callable(method):
        return None
    value = float(method(batch))
    return value if value > 0 else None


def tokens_per_sample(model: nn.Module, batch: Mapping[str, Any] | None = None) -> int | None:
    """Tokens of one sample (of this batch's shape, when the model's method takes a
    batch, as the built-in models' do), when the model says."""
    method = getattr(model, "tokens_per_sample", None)
    if not callable(method):
        return None
    takes_batch = batch is not None and _takes_an_argument(method)
    return int(method(batch) if takes_batch else method())


def _takes_an_argument(method: Any) -> bool:
    try:
        return bool(inspect.signature(method).parameters)
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class SampleCost:
    """What one sample of a batch's shape costs: training FLOPs and tokens (None where
    the model does not say)."""

    flops: float | None
    tokens: int | None


class SampleCosts:
    """`SampleCost` per batch shape, asked of the model once per shape: with
    data.buckets a few shapes, each a few Python calls once, not a call every batch."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._known: dict[tuple[Any, ...], SampleCost] = {}

    def of(self, batch: Mapping[str, Any]) -> SampleCost:
        key = shape_key(batch)
        cost = self._known.get(key)
        if cost is None:
            model = self.model
            cost = SampleCost(flops_per_sample(model, batch), tokens_per_sample(model, batch))
            self._known[key] = cost
        return cost


def shape_key(batch: Mapping[str, Any]) -> tuple[Any, ...]:
    """The per-sample shapes of a batch's stacked tensors, by name (not the batch size)."""
    return tuple(
        sorted((name, tuple(v.shape[1:])) for name, v in batch.items() if torch.is_tensor(v))
    )


def init_weights(model: nn.Module) -> None:
    """`init_weights()` when the model has it; else its parameters stay as built."""
    method = getattr(model, "init_weights", None)
    if callable(method):
        method()
