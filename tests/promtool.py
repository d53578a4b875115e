"""Prometheus' `promtool`, which checks the text `stoker insights --prometheus` writes:
Debian's `prometheus` package.

    python tests/promtool.py install    # apt-get prometheus unless it is there (`make test`)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys


def install() -> int:
    if shutil.which("promtool"):
        print("promtool: installed")
        return 0
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        print("promtool: missing, and no apt-get run as root to install it", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update"],
                    [apt, "install", "-y", "--no-install-recommends", "prometheus"]):  # fmt: skip
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(
                f"promtool: {' '.join(command)} failed:\n{result.stderr[-2000:]}", file=sys.stderr
            )
            return 1
    print(f"promtool: installed {shutil.which('promtool')}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
