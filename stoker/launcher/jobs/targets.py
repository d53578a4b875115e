"""Which jobs a command targets: rows of the ledger, one per job or array task.

`select_jobs` is `stoker status`'s choice (named ids, all, or the active and recent
ones); `resolve_job` is the one job `stoker logs` and `stoker why` name.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.rundir import RunDir

# Jobs that ended this long ago still show without --all.
RECENT_S = 24 * 3600
# Looking for a recent end among jobs submitted this long ago is not worth a stat each.
_LOOKBACK_S = 30 * 24 * 3600


@dataclass(frozen=True)
class Target:
    """What a command targets: a job, or one task of an array job."""

    record: JobRecord
    task: int | None = None

    @property
    def job_id(self) -> str:
        return self.record.job_id if self.task is None else f"{self.record.job_id}_{self.task}"

    @property
    def run(self) -> RunDir:
        run = RunDir(Path(self.record.run_dir))
        return run if self.task is None else run.task(self.task)

    @property
    def mlflow_run_id(self) -> str | None:
        """The job's MLflow run; for an array task its child run, from the list in
        extra["child_run_ids"] that `stoker submit` records (by task index)."""
        if self.task is None:
            return self.record.mlflow_run_id
        runs = self.record.extra.get("child_run_ids")
        if not isinstance(runs, list) or self.task >= len(runs):
            return None
        value = runs[self.task]
        return value if isinstance(value, str) else None


def select_jobs(
    ledger: Ledger, job_ids: Sequence[str] = (), *, all_jobs: bool = False, now: float | None = None
) -> list[Target]:
    """The rows to show: `job_ids` (an array id gives all its tasks, "123_4" one task),
    else every job with `all_jobs`, else active jobs and those that ended in the last 24 h.

    Raises StokerError for an id the ledger does not know.
    """
    if job_ids:
        targets: list[Target] = []
        for job_id in job_ids:
            targets.extend(_targets_for_id(ledger, job_id.strip()))
        return list({t.job_id: t for t in targets}.values())  # each row once
    now = time.time() if now is None else now
    records = ledger.list()
    if not all_jobs:
        records = [r for r in records if r.final_state is None or _recent(r, now)]
    return [t for r in records for t in targets_of(r)]


def targets_of(record: JobRecord) -> list[Target]:
    """The job, or each task of a job array."""
    if record.array_size:
        return [Target(record, i) for i in range(record.array_size)]
    return [Target(record)]


def _targets_for_id(ledger: Ledger, job_id: str) -> list[Target]:
    record = ledger.get(job_id)
    if record is not None:
        return targets_of(record)
    base, sep, index = job_id.partition("_")
    if sep and index.isdigit():
        parent = ledger.require(base)
        if parent.array_size and int(index) < parent.array_size:
            return [Target(parent, int(index))]
        size = f"{parent.array_size} tasks" if parent.array_size else "no array tasks"
        raise StokerError(
            f"job {base} has {size}, so {job_id} is not one of them",
            fix=f"`stoker status {base}` lists its tasks",
        )
    ledger.require(job_id)  # raises with the fix
    return []


def _recent(record: JobRecord, now: float) -> bool:
    """Did this ended job end in the last RECENT_S? Judged by when its run folder was
    last written (the batch log, the local supervisor's state file)."""
    if record.submitted_at >= now - RECENT_S:
        return True  # it cannot have ended before it was submitted
    if record.submitted_at < now - _LOOKBACK_S:
        return False
    run = RunDir(Path(record.run_dir))
    for path in (run.batch_log, run.local_state, run.attempts):
        try:
            if path.stat().st_mtime >= now - RECENT_S:
                return True
        except OSError:
            continue
    return False


def resolve_job(job_id: str, ledger: Ledger | None = None, *, command: str = "logs") -> Target:
    """The one job (or array task) `job_id` names.

    Raises the ledger's StokerError for an unknown id, and a StokerError listing
    the task ids when `job_id` is a whole job array.
    """
    targets = select_jobs(ledger or Ledger(), [job_id])
    if len(targets) == 1:
        return targets[0]
    ids = [t.job_id for t in targets]
    shown = ", ".join(ids[:10]) + (f", ... ({len(ids)} in all)" if len(ids) > 10 else "")
    raise StokerError(
        f"job {job_id} is a job array of {len(ids)} tasks: {shown}",
        fix=f"name one task, e.g. `stoker {command} {ids[0]}`",
    )
