"""Run the installed `stoker` console script as a user would: a real process, real
stdout/stderr split, real exit code (and a pseudo-terminal when a test needs one)."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

STOKER = str(Path(sys.executable).with_name("stoker"))


def stoker(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = False,
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [STOKER, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"stoker {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
        )
    return result


def stoker_in_tty(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """Output of `stoker ARGS` with stdout and stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    # The caller's env decides colour: drop what the outer environment says about it.
    inherited = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    full_env = {**inherited, "TERM": "xterm-256color", "COLUMNS": "160", **(env or {})}
    proc = subprocess.Popen(
        [STOKER, *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=full_env,
        cwd=cwd,
        close_fds=True,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO once the child has closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=120)
    os.close(master)
    return b"".join(chunks).decode(errors="replace")
