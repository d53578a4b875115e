"""Running SLURM's commands: one place that turns their failures into clear errors.

Every call goes through `run_slurm`, so tests and benchmarks can count
scheduler calls (`SlurmCalls`) and a missing or failing command always reads
the same way.
"""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence

from stoker.errors import StokerError

# Scheduler calls made by this process, by command name (squeue, sacct, ...).
CALLS: Counter[str] = Counter()


class SlurmError(StokerError):
    """A SLURM command failed or is missing; the message carries its stderr."""

    def __init__(self, message: str, *, fix: str | None = None, stderr: str = "") -> None:
        super().__init__(message, fix=fix)
        self.stderr = stderr


def slurm_available(command: str = "sbatch") -> bool:
    return shutil.which(command) is not None


def run_slurm(
    argv: Sequence[str],
    *,
    input_text: str | None = None,
    timeout: float = 60,
    fix: str | None = None,
) -> str:
    """Run a SLURM command and return its stdout; raise SlurmError naming it on failure."""
    command = argv[0]
    if shutil.which(command) is None:
        raise SlurmError(
            f"`{command}` was not found on PATH",
            fix="run stoker on a SLURM login node (or `module load slurm`), "
            "or use `stoker submit --local` to run without SLURM",
        )
    CALLS[command] += 1
    try:
        result = subprocess.run(
            list(argv),
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(
            f"`{' '.join(argv)}` did not answer within {timeout:.0f} s",
            fix="the SLURM controller may be overloaded or down; `stoker doctor` checks it",
        ) from exc
    if result.returncode != 0:
        stderr = result.stderr.strip()
        raise SlurmError(
            f"`{' '.join(argv)}` failed (exit {result.returncode}): {stderr or 'no message'}",
            fix=fix,
            stderr=stderr,
        )
    return result.stdout
