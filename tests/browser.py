"""Headless Chromium for the tests that check what a person looks at (the MLflow UI):
Debian's `chromium`, driven by Playwright (PyPI `playwright`, a dev extra) through its
executable path, so no browser download is needed.

    python tests/browser.py install    # apt-get chromium unless it is there (`make test` does)
"""

from __future__ import annotations

import os
import shutil
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
    from tests.apt_install import apt_install

    if any(shutil.which(name) for name in NAMES):
        print("browser: chromium is installed")
        return 0
    if apt_install("browser", ["chromium"]):
        return 1
    print(f"browser: installed {chromium_path()}")
    return 0


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: `tests`
    if sys.argv[1:] != ["install"]:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(install())
