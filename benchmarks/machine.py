"""What a benchmark ran on, recorded in every result file."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                if flags and not cpu.startswith(platform.machine()):
                    break
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        # The VMs come in two CPU kinds; decode speed (swscale, H.264) differs between them.
        "avx512": "avx512f" in flags,
        "python": sys.version.split()[0],
    }
