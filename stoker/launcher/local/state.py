"""The local backend's local-state.json: written by the supervisor of a `--local` job
(stoker/launcher/local/supervisor.py) before the first rank starts and after the last
one ends; read by `stoker status`, `logs`, `why` and `cancel`.

    {"state": "RUNNING" | "COMPLETED" | "FAILED" | "CANCELLED",
     "exit_code": int | null, "supervisor_pid": int, "started": epoch,
     "ended": epoch | null, "ranks": {"0": exit_code | null, ...},
     "cpu_s": float}   (at the end: the CPU seconds of the supervisor and its ranks, as
                        sacct's TotalCPU of a SLURM job)

A RUNNING state whose supervisor process is gone means the supervisor died (what
NODE_FAIL is on a cluster).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.atomic_write import write_text_atomic
from stoker.launcher.jobs.json_fields import int_field, number_field
from stoker.launcher.jobs.rundir import RunDir


@dataclass(frozen=True)
class LocalState:
    """The local backend's local-state.json (see the module docstring)."""

    state: str
    exit_code: int | None
    supervisor_pid: int | None
    started: float | None
    ended: float | None
    ranks: dict[int, int | None]
    cpu_s: float | None = None  # at the end


def write_local_state(run: RunDir, state: Mapping[str, Any]) -> None:
    """Replace local-state.json at once (readers never see half a file)."""
    write_text_atomic(run.local_state, json.dumps(state, indent=2))


def read_local_state(run: RunDir) -> LocalState | None:
    """The supervisor's last record, or None (absent, caught mid-write, or not an object)."""
    try:
        data = json.loads(run.local_state.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        return None
    ranks: dict[int, int | None] = {}
    raw_ranks = data.get("ranks")
    if isinstance(raw_ranks, dict):
        for rank, code in raw_ranks.items():
            if str(rank).isdigit():
                ranks[int(rank)] = code if isinstance(code, int) else None
    return LocalState(
        state=data["state"].upper(),
        exit_code=int_field(data, "exit_code"),
        supervisor_pid=int_field(data, "supervisor_pid"),
        started=number_field(data, "started"),
        ended=number_field(data, "ended"),
        ranks=ranks,
        cpu_s=number_field(data, "cpu_s"),
    )


def pid_exists(pid: int) -> bool:
    """Is there a process `pid` (ours or someone else's)? `process_alive` also tells a
    reused pid and a zombie from the supervisor."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    return True


def process_alive(pid: int, started: float | None) -> bool:
    """Is `pid` still the supervisor that wrote `started`? A reused pid belongs to a
    process that started later; a zombie has exited."""
    if not pid_exists(pid):
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        with open("/proc/stat") as proc_stat:
            boot = next(float(line.split()[1]) for line in proc_stat if line.startswith("btime"))
    except (OSError, StopIteration, ValueError):
        return True  # no /proc (macOS): trust kill(0)
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return False
    process_start = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    # btime is whole seconds and the supervisor writes `started` after it starts.
    return started is None or process_start <= started + 2.0
