"""Which processes still run with a marker in their environment: a job's or a rank's
descendants, found in /proc whoever their parent is now (orphans are re-parented)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest


def marked_processes(marker: str) -> dict[int, str]:
    """`{pid: command line}` of the live processes whose environment holds `marker`."""
    found: dict[int, str] = {}
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state == "Z":
                continue  # ended, waiting for its parent to reap it
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # ended while we looked, or not ours to read
        found[int(entry.name)] = cmdline.strip()
    return found


def wait_none_marked(marker: str, timeout: float = 120) -> None:
    """Wait until no process carries `marker`; fail naming those left."""
    deadline = time.monotonic() + timeout
    left = marked_processes(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = marked_processes(marker)
    if left:
        listing = "\n".join(f"  {pid}: {cmd[:200]}" for pid, cmd in sorted(left.items()))
        pytest.fail(f"{len(left)} process(es) outlived their parent after {timeout} s:\n{listing}")
