"""apt-get for the tools a test needs from Debian (Chromium, promtool): `make test`
installs them through the `install` entry of tests/browser.py and tests/promtool.py."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def apt_install(label: str, packages: list[str]) -> int:
    """apt-get update and install `packages`; 0 on success, 1 with the reason on stderr."""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        print(f"{label}: missing, and no apt-get run as root to install it", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update"], [apt, "install", "-y", "--no-install-recommends", *packages]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(f"{label}: {' '.join(command)} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
            return 1
    return 0
