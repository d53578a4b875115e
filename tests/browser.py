"""Headless Chromium for the tests that check what a person looks at (the MLflow UI):
Debian's `chromium`, driven by Playwright (PyPI `playwright`, a dev extra) through its
executable path, so no browser download is needed.

    python tests/browser.py install    # apt-get chromium unless it is there (`make test` does)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome")
INSTALL = "python tests/browser.py install (apt-get install chromium; `make test` runs it)"


def chromium_path() -> str:
    """The browser's executable; AssertionError with the fix when there is none (a test
    that needs it fails rather than skips: `make test` installs it)."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError(f"no Chromium on PATH ({', '.join(NAMES)}): {INSTALL}")


@contextmanager
def headless_page(width: int = 1440, height: int = 900) -> Iterator[Any]:
    """A Playwright page in headless Chromium, `width` x `height` CSS pixels."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path(),
            # Root in a container has no user namespace for Chromium's sandbox.
            args=["--no-sandbox"] if os.geteuid() == 0 else [],
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def install() -> int:
    if any(shutil.which(name) for name in NAMES):
        print("browser: chromium is installed")
        return 0
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        print("browser: no chromium, and no apt-get run as root to install it", file=sys.stderr)
        return 1
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in ([apt, "update"], [apt, "install", "-y", "--no-install-recommends", "chromium"]):
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            print(f"browser: {' '.join(command)} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
            return 1
    print(f"browser: installed {chromium_path()}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["install"]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
