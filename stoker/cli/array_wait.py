"""What the data jobs' commands (`data encode --slurm`, `data pack --slurm`) share: the
flags that only a SLURM run takes, and `--wait`, which follows a job array to its end
through the same calls as `stoker.api.Job.wait`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def refuse_slurm_flags(slurm: bool, flags: Mapping[str, Any], what: str) -> None:
    """A StokerError naming the SLURM-only `flags` given (not None, not False) without
    --slurm; `what`: "pack", "encode"."""
    from stoker.errors import StokerError

    given = [flag for flag, value in flags.items() if value is not None and value is not False]
    if given and not slurm:
        raise StokerError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to a SLURM "
            f"{what} only",
            fix="add --slurm, or drop " + ("it" if len(given) == 1 else "them"),
        )


def wait_for_array(job_id: str, poll_s: float = 2.0) -> dict[str, str]:
    """Until every task of array `job_id` has ended for good; each task's final state."""
    from stoker.api import Job
    from stoker.cli.output import note
    from stoker.launcher.jobs.ledger import Ledger

    record = Ledger().require(job_id)
    states: dict[str, str] = {}
    for index in range(record.array_size or 1):
        task_id = f"{job_id}_{index}" if record.array_size else job_id
        states[task_id] = Job(task_id, None, Path(record.run_dir)).wait(poll_s=poll_s)
        note(f"{task_id}: {states[task_id]}")
    return states
