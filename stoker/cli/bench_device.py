"""`--device` of the benchmark commands: auto, cuda, cuda:N or cpu."""

from __future__ import annotations

from typing import Any

from stoker.errors import StokerError


def parse_device(device: str) -> Any:
    """The torch.device `device` names (auto: the GPU if torch sees one), or a
    StokerError naming the value."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise StokerError(f"--device {device!r}: {exc}", fix="--device cuda or cpu") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise StokerError(f"--device {device} but torch sees no CUDA GPU", fix="--device cpu")
    return dev
