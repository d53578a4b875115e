"""Many `stoker` command lines at once, each in a process of its own forked from one that
has imported what they import: `python tests/forked_commands.py OUT_DIR COMMANDS_JSON`.

For tests whose point is many commands racing for the same files (the ledger, the MLflow
store): N processes, each with its own connections and its own exit status, started
within milliseconds of each other. A console script per command would pay the
interpreter and its imports N times (4-5 CPU-s a `stoker submit` on the 2-core VM, mlflow
alone 2-3), which tests of their start-up already cover (tests/test_cli_imports.py).

COMMANDS_JSON is a list of argv lists without the program (`["submit", "--", "true"]`).
Command i's output goes to OUT_DIR/i.out and i.err, its exit status to OUT_DIR/i.code.
The environment and current folder are this process's.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path


def _child(index: int, argv: list[str], out: Path) -> int:
    """In the forked process: `stoker ARGV` with its stdout and stderr in files."""
    for fd, suffix in ((1, "out"), (2, "err")):
        file = os.open(out / f"{index}.{suffix}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(file, fd)
        os.close(file)
    from stoker.cli.main import main

    sys.argv = ["stoker", *argv]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # As the interpreter ends a process: its threads joined, then its atexit handlers
    # (an exit from here would skip both).
    getattr(threading, "_shutdown", lambda: None)()
    getattr(atexit, "_run_exitfuncs", lambda: None)()
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def run_all(commands: list[list[str]], out: Path) -> list[int]:
    """Fork one process per command, all before the first is waited for; their codes."""
    # What a `stoker submit` or `sweep` imports: the CLI and the MLflow store; the
    # garbage collector paused meanwhile, then what they made frozen, so that no
    # child's collections walk it (stoker/process/gc_pause.py).
    from stoker.process.gc_pause import pause_collector, resume_collector

    pause_collector()
    from mlflow.store.tracking import sqlalchemy_store  # noqa: F401
    from mlflow.tracking import MlflowClient  # noqa: F401

    import stoker.cli.app
    import stoker.launcher.launch.submit
    import stoker.tracking.runs  # noqa: F401

    resume_collector()

    # A thread would not be in the children (only the forking one is): none may run yet.
    assert threading.active_count() == 1, threading.enumerate()
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    for index, argv in enumerate(commands):
        pid = os.fork()
        if pid == 0:
            os._exit(_child(index, argv, out))
        children[pid] = index
    codes = [0] * len(commands)
    while children:
        pid, status = os.wait()
        index = children.pop(pid)
        codes[index] = os.waitstatus_to_exitcode(status)
        (out / f"{index}.code").write_text(f"{codes[index]}\n")
    return codes


if __name__ == "__main__":
    where = Path(sys.argv[1])
    where.mkdir(parents=True, exist_ok=True)
    run_all(json.loads(Path(sys.argv[2]).read_text()), where)
