"""Wrap a model for training, block by block, in torchtitan's order:
activation checkpointing, then torch.compile, then FSDP2.

Every model of stoker.runtime.models exposes `model.blocks` (an
nn.ModuleList): those are the units that are recomputed, compiled and sharded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

if TYPE_CHECKING:  # pydantic stays optional for the benchmarks on GPU nodes
    from stoker.config import TrainConfig


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """none; full: every block recomputes its activations in backward;
    selective: every second block does (about half the activation memory for
    a third of full recompute's extra time)."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    blocks: Any = model.blocks
    for index, block in enumerate(blocks):
        if mode == "full" or index % 2 == 0:
            blocks[index] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block (not the whole model): blocks are alike, so
    one compilation serves them all, and FSDP2's hooks stay outside the graphs."""
    blocks: Any = model.blocks
    for index, block in enumerate(blocks):
        blocks[index] = torch.compile(block, fullgraph=True)


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, *, bf16_params: bool) -> None:
    """fully_shard each block, then the root. On a 2-D ("replicate", "shard")
    mesh this is HSDP. bf16_params: all-gather parameters in bf16 and reduce
    gradients in fp32 (GPUs); the fp32 master weights stay sharded."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16_params
        else MixedPrecisionPolicy()
    )
    blocks: Any = model.blocks
    for index, block in enumerate(blocks):
        # The last block's parameters are needed right away by backward:
        # keeping them gathered after forward saves one all-gather.
        fully_shard(
            block, mesh=mesh, mp_policy=policy, reshard_after_forward=index < len(blocks) - 1
        )
    fully_shard(model, mesh=mesh, mp_policy=policy)


def parallelize(
    model: nn.Module,
    train: TrainConfig,
    mesh: DeviceMesh | None,
    device: torch.device,
    precision: str,
) -> nn.Module:
    """`precision`: the resolved one (bf16 or fp32), see runtime/precision.py."""
    apply_activation_checkpointing(model, train.activation_checkpointing)
    if train.compile:
        apply_compile(model)
    if mesh is not None:
        apply_fsdp(model, mesh, bf16_params=precision == "bf16" and device.type == "cuda")
    return model
