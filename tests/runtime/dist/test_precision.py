"""`train.precision` resolved per device: auto picks bf16 only where the hardware
computes it natively, an explicit bf16 on emulating hardware trains but warns."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from stoker.runtime.dist import precision
from stoker.runtime.dist.precision import resolve_precision

CPU = torch.device("cpu")


@pytest.mark.parametrize("native", [True, False])
def test_auto_follows_native_bf16(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(precision, "native_bf16", lambda device: native)
    chosen = resolve_precision("auto", CPU)
    assert chosen.value == ("bf16" if native else "fp32")
    assert chosen.warning is None
    assert "auto" in chosen.reason and chosen.value in chosen.reason


def test_explicit_bf16_on_emulating_hardware_warns_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(precision, "native_bf16", lambda device: False)
    chosen = resolve_precision("bf16", CPU)
    assert chosen.value == "bf16"
    assert chosen.warning is not None and "train.precision=auto" in chosen.warning
    monkeypatch.setattr(precision, "native_bf16", lambda device: True)
    assert resolve_precision("bf16", CPU).warning is None


def test_fp32_is_fp32_everywhere() -> None:
    assert resolve_precision("fp32", CPU).value == "fp32"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/cpuinfo (Linux)")
def test_cpu_detection_matches_the_cpu_flags() -> None:
    # The flags the kernel reports are the truth torch's helpers are checked against.
    flags = Path("/proc/cpuinfo").read_text().split()
    has = "avx512_bf16" in flags or "amx_bf16" in flags
    assert precision.native_bf16(CPU) == has


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU here: checks CUDA bf16 detection")
def test_gpus_since_ampere_have_native_bf16() -> None:
    major, _ = torch.cuda.get_device_capability()
    assert precision.native_bf16(torch.device("cuda")) == (major >= 8)
