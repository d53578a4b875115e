"""`--wait` of the data jobs (`data encode --slurm`, `data pack --slurm`): follow a job
array to its end through the same calls as `stoker.api.Job.wait`."""

from __future__ import annotations

from pathlib import Path


def wait_for_array(job_id: str, poll_s: float = 2.0) -> dict[str, str]:
    """Until every task of array `job_id` has ended for good; each task's final state."""
    from stoker.api import Job
    from stoker.cli.output import note
    from stoker.launcher.ledger import Ledger

    record = Ledger().require(job_id)
    states: dict[str, str] = {}
    for index in range(record.array_size or 1):
        task_id = f"{job_id}_{index}" if record.array_size else job_id
        states[task_id] = Job(task_id, None, Path(record.run_dir)).wait(poll_s=poll_s)
        note(f"{task_id}: {states[task_id]}")
    return states
