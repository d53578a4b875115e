"""Prometheus' `promtool`, which checks the text `stoker insights --prometheus` writes:
Debian's `prometheus` package.

    python tests/promtool.py install    # apt-get prometheus unless it is there (`make test`)
"""

from __future__ import annotations

import shutil
import sys


def install() -> int:
    from tests.apt_install import apt_install

    if shutil.which("promtool"):
        print("promtool: installed")
        return 0
    if apt_install("promtool", ["prometheus"]):
        return 1
    print(f"promtool: installed {shutil.which('promtool')}")
    return 0


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `tests`
    if sys.argv[1:] != ["install"]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
