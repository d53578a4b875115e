"""`stoker doctor`'s checks of this node: apptainer, the GPUs (nvidia-smi), and the
NCCL variables that sbatch passes on to jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from stoker.errors import StokerError
from stoker.launcher.doctor.check import COMMAND_TIMEOUT, Finding


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """A non-SLURM command with the doctor's timeout; a hang becomes a StokerError."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StokerError(
            f"`{' '.join(argv)}` did not answer within {COMMAND_TIMEOUT:.0f} s",
            fix="a hung driver or file system: run it by hand and ask the admins",
        ) from exc


def check_apptainer() -> list[Finding]:
    program = shutil.which("apptainer") or shutil.which("singularity")
    if program is None:
        return [
            Finding(
                "apptainer",
                "warn",
                "not found: neither apptainer nor singularity is on PATH here",
                "only needed for `job.template: apptainer`, and on the compute nodes; "
                "try `module load apptainer`, or ask the admins",
            )
        ]
    result = run_command([program, "--version"])
    version = (result.stdout or result.stderr).strip() or f"exit {result.returncode}"
    return [Finding("apptainer", "ok", f"{version} ({program})")]


def check_gpus() -> list[Finding]:
    program = shutil.which("nvidia-smi")
    if program is None:
        return [
            Finding(
                "gpus",
                "ok",
                "no nvidia-smi on this node (login nodes often have no GPUs; jobs use the "
                "compute nodes')",
            )
        ]
    result = run_command(
        [program, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
    )
    if result.returncode != 0:
        message = (result.stderr or result.stdout).strip() or f"exit {result.returncode}"
        return [
            Finding(
                "gpus",
                "warn",
                f"nvidia-smi fails here: {message}",
                "a driver/library mismatch needs a reboot or driver reload; on a login node "
                "without GPUs this does not affect jobs",
            )
        ]
    return [Finding("gpus", "ok", summarize_gpus(result.stdout))]


def summarize_gpus(csv_text: str) -> str:
    """`8x NVIDIA H100 80GB HBM3 (81559 MiB), driver 550.54.15` from nvidia-smi's CSV."""
    counts: dict[tuple[str, str], int] = {}
    drivers: list[str] = []
    for line in csv_text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        name, driver, memory = parts
        counts[(name, memory)] = counts.get((name, memory), 0) + 1
        if driver not in drivers:
            drivers.append(driver)
    if not counts:
        return "nvidia-smi lists no GPU"
    gpus = ", ".join(f"{n}x {name} ({memory})" for (name, memory), n in counts.items())
    return f"{gpus}, driver {', '.join(drivers)}"


def check_nccl_env() -> list[Finding]:
    names = sorted(k for k in os.environ if k.startswith("NCCL_"))
    if not names:
        return [Finding("nccl env", "ok", "no NCCL_* variable set here (NCCL's defaults)")]
    values = ", ".join(f"{k}={os.environ[k]}" for k in names)
    return [Finding("nccl env", "ok", f"{values} (sbatch passes this environment to jobs)")]
