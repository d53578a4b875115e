"""Run the installed `stoker` console script as a user would: a real process, real
stdout/stderr split, real exit code (and a pseudo-terminal when a test needs one).

`stoker_text` runs the same entry point (`stoker.cli.main:main`) inside the test process,
for tests that check only what a command prints and its exit status: a subprocess pays
the interpreter and the imports again (0.3-4 CPU-seconds; mlflow alone 2-3), which the
suite's budget cannot afford hundreds of times (docs/operations.md). A test whose point
is the process itself (its imports, signals, environment, a terminal) uses `stoker`."""

from __future__ import annotations

import contextlib
import io
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
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


def stoker_text(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    check: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`stoker ARGS` run in this process by the console entry point, as `stoker` would
    run it: the same argument splitting, error printing and exit status; stdout and
    stderr captured apart; `env` added to the environment and `cwd` entered for the call
    only. Leaves the process as it found it (environment, folder, import path, sys.argv)."""
    from stoker.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with (
        _environment(env or {}),
        _folder(cwd),
        _argv(["stoker", *args]),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            main()
        except SystemExit as exc:
            code = _exit_status(exc.code, err)
    result = subprocess.CompletedProcess(["stoker", *args], code, out.getvalue(), err.getvalue())
    if check and code != 0:
        raise AssertionError(f"stoker {' '.join(args)} exited {code}:\n{result.stderr}")
    return result


def _exit_status(code: object, err: io.StringIO) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    err.write(f"{code}\n")  # sys.exit("message"), as the interpreter prints it
    return 1


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(extra)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _folder(path: Path | None) -> Iterator[None]:
    """`path` as the current folder, and the import path as it was after the call: a
    command puts its current folder on it (stoker/import_path.py), as a new process
    would for itself."""
    before, import_path = os.getcwd(), list(sys.path)
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
        sys.path[:] = import_path


@contextlib.contextmanager
def _argv(argv: list[str]) -> Iterator[None]:
    saved = sys.argv
    sys.argv = argv
    try:
        yield
    finally:
        sys.argv = saved
