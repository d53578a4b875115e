"""What a GPU check ran on: GPU, driver, CUDA, torch, triton, Python, host. Written
into every result file, since a figure without its versions cannot be compared."""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from typing import Any

ENV_VARIABLE = "STOKER_GPU_CHECK_ENVIRONMENT"
"""The orchestrator hands the environment it read once to every part."""


def _driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _unavailable() -> list[str]:
    """Which of the modules the GPU machine lacks cannot be imported here."""
    from benchmarks.gpu_check.gpu_tests import BLOCKED_MODULES

    missing = []
    for name in BLOCKED_MODULES:
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


def read_environment() -> dict[str, Any]:
    """The facts, read now (imports torch and triton)."""
    import torch

    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    gpu: dict[str, Any] | None = None
    if cuda:
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "name": props.name,
            "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}",
        }
    return {
        "gpu": gpu,
        "unavailable": sorted(_unavailable()),
        "driver": _driver(),
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton_version,
        "python": sys.version.split()[0],
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def environment() -> dict[str, Any]:
    """The orchestrator's reading when a part runs under it, else a fresh one."""
    handed = os.environ.get(ENV_VARIABLE)
    return json.loads(handed) if handed else read_environment()


def describe(env: dict[str, Any]) -> str:
    gpu = env["gpu"]["name"] if env.get("gpu") else "no GPU (CPU)"
    return (
        f"{gpu}, driver {env.get('driver') or '-'}, CUDA {env.get('cuda') or '-'}, "
        f"torch {env['torch']}, triton {env.get('triton') or '-'}, Python {env['python']}"
    )


if __name__ == "__main__":
    # The orchestrator reads the environment in a child of its own, so that its own
    # process never holds a CUDA context (part b measures the context's size).
    print(json.dumps(read_environment()))
