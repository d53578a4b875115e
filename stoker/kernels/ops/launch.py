"""Launch geometry shared by the kernels: block sizes, warps, how many programs."""

from __future__ import annotations

import functools

import torch
import triton

# Bytes a program should hold per row tile before we give it more warps; a
# 4096-wide bf16 row (8 KiB) is one tile on 8 warps.
_MAX_FUSED_COLS = 65536


def block_cols(n: int) -> int:
    """The power-of-two column block that holds a whole row of `n` elements."""
    block = triton.next_power_of_2(n)
    if block > _MAX_FUSED_COLS:
        raise ValueError(f"row length {n} is above the fused-row limit {_MAX_FUSED_COLS}")
    return block


def warps_for(block: int) -> int:
    """Warps for a tile of `block` elements: about 8-16 fp32 values per thread."""
    if block >= 8192:
        return 16
    if block >= 2048:
        return 8
    if block >= 512:
        return 4
    return 2 if block >= 128 else 1


def rows_per_program(block_n: int) -> int:
    """Rows per program so that a tile holds about 4096 elements: small hidden
    sizes otherwise launch one tiny program per row."""
    return max(1, min(16, 4096 // block_n))


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def program_slots(device: torch.device) -> int:
    """Programs that run at once (two per SM): the grid of kernels that loop
    over rows and write one partial reduction per program. The interpreter on
    CPU has no SMs: four keeps its tests quick."""
    if device.type != "cuda":
        return 4
    return 2 * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
