"""PyTorch's flight recorder: each rank's ring buffer of its recent collectives (which
one, in which process group, its sequence number, its state), kept by torch itself.

`configure` turns it on before the process group is made (torch reads the variables
then): TORCH_FR_BUFFER_SIZE entries for any backend (torch records gloo collectives
too), and for NCCL its own dump when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT,
into TORCH_FR_DUMP_TEMP_FILE in the run folder). A value the job's environment already
sets is kept. `dump` writes the buffer as JSON to <run>/flight/r<restart>/rank-<R>.json:
the hang watchdog's dump calls it on every rank, and a rank whose collective lost a
peer calls it before it exits. `stoker why` compares the ranks' last sequence numbers
to name the rank that fell behind and the collective the others wait in.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from stoker.protocol import ENV_RESTART, ENV_RUN_DIR, FLIGHT_DIR, FLIGHT_FILE

BUFFER_ENTRIES = 2000
"""Collectives kept per rank: an FSDP2 step of a 30-block model issues about 100."""


def folder(run_dir: Path, restart: int) -> Path:
    return Path(run_dir) / FLIGHT_DIR / f"r{restart}"


def configure(environ: MutableMapping[str, str], *, cuda: bool) -> None:
    """Set the flight recorder's variables in `environ` (os.environ) for this task,
    from the run folder and restart the launcher gave it; nothing outside a job."""
    run_dir = environ.get(ENV_RUN_DIR)
    if not run_dir:
        return
    environ.setdefault("TORCH_FR_BUFFER_SIZE", str(BUFFER_ENTRIES))
    if cuda:
        where = folder(Path(run_dir), int(environ.get(ENV_RESTART) or 0))
        with contextlib.suppress(OSError):
            where.mkdir(parents=True, exist_ok=True)
        environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(where / "nccl-trace-rank-"))


def dump(rank: int, environ: MutableMapping[str, str] | None = None) -> Path | None:
    """This rank's flight recorder as JSON in the run folder; None when there is no
    run folder or torch records nothing. Best effort: it runs on the way out of a
    failed job, from any thread."""
    environ = os.environ if environ is None else environ
    run_dir = environ.get(ENV_RUN_DIR)
    if not run_dir or not int(environ.get("TORCH_FR_BUFFER_SIZE") or 0):
        return None
    try:
        import torch

        c10d: Any = torch._C._distributed_c10d  # private, not in torch's stubs
        use_nccl = torch.cuda.is_available() and hasattr(c10d, "_dump_nccl_trace_json")
        dumper = c10d._dump_nccl_trace_json if use_nccl else c10d._dump_fr_trace_json
        data = dumper(includeCollectives=True, onlyActive=False)
        path = folder(Path(run_dir), int(environ.get(ENV_RESTART) or 0))
        path.mkdir(parents=True, exist_ok=True)
        out = path / FLIGHT_FILE.format(rank=rank)
        out.write_bytes(data if isinstance(data, bytes) else str(data).encode())
        return out
    except Exception as exc:  # a recorder that fails must not hide the job's own failure
        print(f"stoker: rank {rank}: flight recorder dump failed: {exc}", file=sys.stderr,
              flush=True)
        return None
