"""N ranks of a script on this machine, started as `torchrun --standalone
--nproc-per-node N` starts them, by a launcher that imports no torch:

    python tests/local_ranks.py --nproc-per-node N --master-port P SCRIPT [ARGS...]

torchrun's own interpreter costs 2.5 CPU-s of imports per launch on the 2-core VM, and
the suite's multi-rank tests launch eleven: what they test is the ranks, not torchrun.
Each rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which stoker's ranks read
(stoker/runtime/dist/dist_env.py; `stoker run` sets the same), and inherits stdout and
stderr; its imports are made with the collector paused (tests/paused_imports.py), as
stoker's own ranks make theirs. As torchrun does, the first rank to exit non-zero (or
by a signal) ends the others (SIGTERM, then SIGKILL after 10 s), and the launcher then
exits 1; 0 when every rank did. A SIGTERM or SIGINT to the launcher is passed to the ranks.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

LAUNCHER = Path(__file__).resolve()
# Each rank's imports with the collector paused, as stoker's ranks import.
PAUSED_IMPORTS = LAUNCHER.parent / "paused_imports.py"
GRACE_S = 10.0


def command(nproc: int, script: Path | str, *args: str) -> list[str]:
    """The argv that runs `script` on `nproc` local ranks (for subprocess), on a free
    port picked here, in the test's process (tests/mlflow_server.py's free_port)."""
    from tests.mlflow_server import free_port

    return [sys.executable, str(LAUNCHER), "--nproc-per-node", str(nproc), "--master-port",
            str(free_port()), str(script), *args]  # fmt: skip


def _end(ranks: list[subprocess.Popen[bytes]], how: int = signal.SIGTERM) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.send_signal(how)
    deadline = time.monotonic() + GRACE_S
    for rank in ranks:
        try:
            rank.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            rank.kill()
            rank.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc-per-node", type=int, required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    options = parser.parse_args(argv)
    nproc = options.nproc_per_node
    shared = {
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(options.master_port),
    }
    ranks: list[subprocess.Popen[bytes]] = []

    def passed_on(signum: int, _frame: object) -> None:
        _end(ranks, signum)
        sys.exit(128 + signum)

    # Before the first rank starts: a signal meanwhile reaches the ranks started so far.
    signal.signal(signal.SIGTERM, passed_on)
    signal.signal(signal.SIGINT, passed_on)
    for number in range(nproc):
        env = {**os.environ, **shared, "RANK": str(number), "LOCAL_RANK": str(number)}
        ranks.append(subprocess.Popen([sys.executable, "-u", str(PAUSED_IMPORTS), options.script,
                                       *options.args], env=env))  # fmt: skip
    first_failure: tuple[int, int] | None = None  # (rank, exit code)
    while first_failure is None and any(rank.returncode is None for rank in ranks):
        pid, status = os.wait()  # whichever rank ends first
        for index, rank in enumerate(ranks):
            if rank.pid == pid:
                rank.returncode = os.waitstatus_to_exitcode(status)
                if rank.returncode != 0:
                    first_failure = (index, rank.returncode)
    if first_failure is not None:
        _end(ranks)
        index, code = first_failure
        print(f"local_ranks: rank {index} exited {code}; the others were ended", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
