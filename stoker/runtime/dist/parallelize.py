"""Wrap a model for training, block by block, in torchtitan's order:
activation checkpointing, then torch.compile, then FSDP2.

A model's blocks (`blocks()`, or a `blocks` ModuleList: the contract of
stoker/model.py) are the units that are recomputed, compiled and sharded on a GPU;
a model without blocks is one unit, sharded at its root. On CPU ranks the whole
model is one FSDP2 unit (see `apply_fsdp`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from stoker.modes import ActivationCheckpointing, ResolvedPrecision
from stoker.runtime.models.contract import block_slots

if TYPE_CHECKING:  # pydantic stays optional for the benchmarks on GPU nodes
    from stoker.config import TrainConfig


def apply_activation_checkpointing(model: nn.Module, mode: str) -> None:
    """none; full: every block recomputes its activations in backward;
    selective: every second block does (about half the activation memory for
    a third of full recompute's extra time)."""
    if mode == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    for index, (parent, name) in enumerate(block_slots(model)):
        if mode == "full" or index % 2 == 0:
            block = getattr(parent, name)
            setattr(parent, name, checkpoint_wrapper(block, preserve_rng_state=False))


def apply_compile(model: nn.Module) -> None:
    """torch.compile each block (not the whole model): blocks are alike, so
    one compilation serves them all, and FSDP2's hooks stay outside the graphs."""
    for parent, name in block_slots(model):
        setattr(parent, name, torch.compile(getattr(parent, name), fullgraph=True))


def apply_fsdp(
    model: nn.Module, mesh: DeviceMesh, *, bf16_params: bool, per_block: bool = True
) -> None:
    """fully_shard each block (per_block), then the root. On a 2-D ("replicate",
    "shard") mesh this is HSDP. bf16_params: all-gather parameters in bf16 and reduce
    gradients in fp32 (GPUs); the fp32 master weights stay sharded.

    per_block=False shards the model as one unit: one all-gather before forward, one
    reduce-scatter after backward. That is what CPU ranks get: gloo's collectives run
    in series with a CPU rank's compute, so per-block units overlap nothing there and
    their all-gathers cost a step of the tiny preset as much as its forward and backward
    (210 against 155 ms, docs/runtime.md). The checkpoint is the same either way: FSDP2
    shards each parameter alike, whatever its unit."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16_params
        else MixedPrecisionPolicy()
    )
    slots = block_slots(model) if per_block else []
    for index, (parent, name) in enumerate(slots):
        # The last block's parameters are needed right away by backward:
        # keeping them gathered after forward saves one all-gather.
        fully_shard(
            getattr(parent, name), mesh=mesh, mp_policy=policy,
            reshard_after_forward=index < len(slots) - 1,
        )
    fully_shard(model, mesh=mesh, mp_policy=policy)


def parallelize(
    model: nn.Module,
    train: TrainConfig,
    mesh: DeviceMesh | None,
    device: torch.device,
    precision: ResolvedPrecision,
) -> nn.Module:
    """`precision`: the resolved one (bf16 or fp32), see runtime/precision.py."""
    apply_activation_checkpointing(model, train.activation_checkpointing)
    if train.compile:
        apply_compile(model)
    if mesh is not None:
        gpu = device.type == "cuda"
        apply_fsdp(model, mesh, bf16_params=precision == "bf16" and gpu, per_block=gpu)
    return model
