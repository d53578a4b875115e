"""What a benchmark ran on, recorded in every result file."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
    }
