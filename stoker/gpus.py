"""What stoker knows of each GPU model: memory, dense bf16 and fp32 peaks, memory and
NVLink bandwidth, from the vendors' data sheets. The runtime's MFU divides by the bf16
peak (stoker/runtime/models/flops.py); `stoker plan` sizes and times its candidates with
all of it. Imports nothing: the login node reads it.

Matched by name, most specific first, against `torch.cuda.get_device_name` ("NVIDIA H100
80GB HBM3"), a SLURM GRES type ("h100", "a100_80g") or what a user types (`--gpu H200`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model."""

    name: str
    memory_gib: float
    """Device memory, GiB (the data sheets' "80 GB" HBM is 80 GiB as the driver reports)."""
    bf16_flops: float
    """Dense (not 2:4 sparse) bf16 tensor-core peak, FLOP/s."""
    fp32_flops: float
    """fp32 peak without tensor cores (what an fp32 run's matmuls get unless TF32 is on)."""
    hbm_bytes_s: float
    """Device memory bandwidth, bytes/s."""
    nvlink_bytes_s: float
    """Per-GPU NVLink bandwidth, one direction, bytes/s (0: PCIe only, see PCIE_BYTES_S)."""

    def with_memory(self, gib: float) -> GPUSpec:
        return replace(self, memory_gib=gib)


PCIE_BYTES_S = 25e9
"""What a PCIe Gen4/5 x16 link gives a collective in practice, one direction."""

KNOWN_GPUS: tuple[tuple[str, GPUSpec], ...] = (
    ("GH200", GPUSpec("GH200", 96, 989e12, 67e12, 4.0e12, 450e9)),
    ("H100 NVL", GPUSpec("H100 NVL", 94, 835e12, 60e12, 3.9e12, 300e9)),
    ("H100 PCIe", GPUSpec("H100 PCIe", 80, 756e12, 51e12, 2.0e12, 0)),
    ("H100", GPUSpec("H100 SXM", 80, 989e12, 67e12, 3.35e12, 450e9)),
    ("H200", GPUSpec("H200 SXM", 141, 989e12, 67e12, 4.8e12, 450e9)),
    ("B200", GPUSpec("B200", 180, 2250e12, 75e12, 7.7e12, 900e9)),
    ("A100 40", GPUSpec("A100 40GB", 40, 312e12, 19.5e12, 1.56e12, 300e9)),
    ("A100", GPUSpec("A100 80GB", 80, 312e12, 19.5e12, 2.04e12, 300e9)),
    ("L40S", GPUSpec("L40S", 48, 362e12, 91.6e12, 0.864e12, 0)),
    ("A10", GPUSpec("A10", 24, 125e12, 31.2e12, 0.6e12, 0)),
)


def _squash(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def gpu_spec(name: str) -> GPUSpec | None:
    """The GPU whose key `name` contains ("NVIDIA H100 80GB HBM3" is the H100 SXM,
    "a100_40g" the A100 40GB), or None."""
    squashed = _squash(name)
    for key, spec in KNOWN_GPUS:
        if _squash(key) in squashed:
            return spec
    return None


def known_gpu_names() -> list[str]:
    return [key for key, _ in KNOWN_GPUS]
