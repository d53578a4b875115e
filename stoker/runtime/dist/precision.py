"""Which precision a rank trains in: `train.precision` resolved against its device.

`auto` (the default) means bf16 autocast where the hardware computes in bf16 and
plain fp32 where it would only emulate it. A CPU without AVX512-BF16 or AMX runs
bf16 autocast several times slower than fp32 (measured: 1.5 against 5.7
samples/s for the tiny model on an AVX2 EPYC), so `auto` picks fp32 there; an
explicit `bf16` is honoured with a warning that says what it costs.
"""

from __future__ import annotations

from dataclasses import dataclass
import torch

from stoker.modes import Precision as Requested
from stoker.modes import ResolvedPrecision as Resolved


@dataclass(frozen=True)
class Precision:
    value: Resolved
    reason: str  # one line for the log: why this precision on this device
    warning: str | None = None  # set when the user's choice will be slow here


def native_bf16(device: torch.device) -> bool:
    """Whether `device` computes bf16 matmuls in hardware."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        # Private but stable since torch 2.1; absent means we cannot tell: say no.
        cpu = getattr(torch, "cpu", None)
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)
    return False


def resolve_precision(requested: Requested, device: torch.device) -> Precision:
    native = native_bf16(device)
    where = "this GPU" if device.type == "cuda" else "this CPU"
    if requested == "fp32":
        return Precision("fp32", "train.precision=fp32")
    if requested == "bf16":
        warning = None
        if not native:
            warning = (
                f"train.precision=bf16 but {where} has no native bf16: autocast emulates it "
                "and trains several times slower than fp32; set train.precision=auto or fp32"
            )
        return Precision("bf16", "train.precision=bf16", warning)
    if requested != "auto":
        raise ValueError(f"train.precision {requested!r}: expected auto, bf16 or fp32")
    if native:
        return Precision("bf16", f"train.precision=auto: bf16, native on {where}")
    return Precision("fp32", f"train.precision=auto: fp32, {where} has no native bf16")
