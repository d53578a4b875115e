"""Run a rendered batch script under bash as sbatch would, without SLURM: `srun`,
`scontrol` and `apptainer` are shims that run the task once as rank 0 and record the
arguments they got. For tests of what the script does with hostile values and secrets."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

# srun: write its own argv (NUL-separated), drop its --options, run the task as rank 0.
_SRUN = """#!/bin/bash
printf '%s\\0' "$@" > "$SHIM_OUT/srun.args"
while [[ $1 == --* ]]; do shift; done
SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 "$@"
"""
# scontrol: the two questions the script asks (hostnames of the job, a node's address).
_SCONTROL = """#!/bin/bash
[ "$2" = hostnames ] && echo n1 || echo "NodeName=n1 NodeAddr=10.0.0.7"
"""
# apptainer exec [--nv] [--bind B] [--pwd P] IMAGE CMD...: run CMD, record IMAGE.
_APPTAINER = """#!/bin/bash
shift
while [[ $1 == --* ]]; do [ "$1" = --nv ] && shift || shift 2; done
printf '%s' "$1" > "$SHIM_OUT/apptainer.image"
shift
"$@"
"""


@dataclass(frozen=True)
class ShimRun:
    returncode: int
    stdout: str
    stderr: str
    out: Path
    """The shims' records: srun.args, apptainer.image, and what the task wrote."""

    def srun_args(self) -> list[str]:
        path = self.out / "srun.args"
        return path.read_text().split("\0")[:-1] if path.exists() else []


# Generous: the script ends by starting Python (stoker.tracking.run_end), seconds on a
# loaded 2-core machine; a hung script still fails well inside pytest's own timeout.
SCRIPT_TIMEOUT_S = 180


def prepare_batch_script(
    text: str,
    folder: Path,
    env: dict[str, str] | None = None,
    shims: dict[str, str] | None = None,
) -> tuple[Path, dict[str, str]]:
    """Write `text` to `folder`/job.sh and the shims to `folder`/shim-bin: (the script,
    the environment to run it in, the shims first on PATH). The task and the shims find
    their output folder in $SHIM_OUT. `shims` replaces or adds shims (name -> script)."""
    bin_dir = folder / "shim-bin"
    bin_dir.mkdir(exist_ok=True)
    bodies = {"srun": _SRUN, "scontrol": _SCONTROL, "apptainer": _APPTAINER, **(shims or {})}
    for name, body in bodies.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    out = folder / "shim-out"
    out.mkdir(exist_ok=True)
    script = folder / "job.sh"
    script.write_text(text)
    return script, {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SHIM_OUT": str(out),
        "SLURM_JOB_ID": "42",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_NTASKS": "1",
        **(env or {}),
    }


def run_batch_script(
    text: str,
    folder: Path,
    env: dict[str, str] | None = None,
    shims: dict[str, str] | None = None,
    log: Path | None = None,
) -> ShimRun:
    """Run `text` under bash as prepare_batch_script sets it up. With `log`, the
    script's output is appended there, as sbatch's --output does (the result's stdout
    and stderr are then empty)."""
    script, run_env = prepare_batch_script(text, folder, env, shims)
    out = folder / "shim-out"
    if log is None:
        result = subprocess.run(["bash", str(script)], cwd=folder, capture_output=True,
                                text=True, timeout=SCRIPT_TIMEOUT_S, env=run_env)  # fmt: skip
        return ShimRun(result.returncode, result.stdout, result.stderr, out)
    with open(log, "ab") as output:
        code = subprocess.run(["bash", str(script)], cwd=folder, stdout=output, stderr=output,
                              timeout=SCRIPT_TIMEOUT_S, env=run_env).returncode  # fmt: skip
    return ShimRun(code, "", "", out)
