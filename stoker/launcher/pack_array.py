"""`stoker data pack --slurm`: the shard writers as one SLURM job array, via submitit.

It lives in the launcher because stoker.data knows nothing of SLURM: the CLI hands
a SlurmArrayRunner to stoker.data.pack.run_pack as its ShardRunner.

Each array task writes a contiguous run of shards (one each while there are at
most MAX_ARRAY_TASKS shards) and returns their results, skipped inputs included.
This process waits, advancing the progress as tasks finish; a failed task is
reported with its log, and its finished shards stay for a re-run to keep. The
jobs run `sys.executable`, so the nodes must see this Python and its packages
(the usual shared-filesystem install).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.data.pack_write import ShardResult, ShardTask, write_planned_shards
from stoker.errors import StokerError

SLURM_DIR = "pack-slurm"
# Many clusters cap arrays at 1001 tasks (MaxArraySize); beyond this, tasks take several shards.
MAX_ARRAY_TASKS = 1000
POLL_SECONDS = 1.0


@dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    """None: the cluster's default partition."""
    time_min: int = 60
    """Time limit of each array task, in minutes."""
    cpus_per_task: int = 1


@dataclass(frozen=True)
class SlurmArrayRunner:
    """A ShardRunner (stoker.data.pack) that writes the shards in a SLURM job array."""

    options: SlurmOptions

    def __call__(
        self,
        tasks: list[ShardTask],
        parallelism: int | None,
        dst_fs: Any,
        dst_root: str,
        advance: Callable[[int], None],
    ) -> tuple[dict[int, ShardResult], dict[int, str]]:
        folder = submitit_folder(dst_fs, dst_root)
        return run_on_slurm(tasks, self.options, parallelism, folder, advance)


def submitit_folder(fs: Any, root: str) -> Path:
    """submitit's folder (pickles, logs): under DST when it is local, else STOKER_HOME."""
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    if "file" in protocols:
        return Path(root) / SLURM_DIR
    from stoker.home import stoker_home

    url = fs.unstrip_protocol(root)
    return stoker_home() / "pack" / hashlib.sha256(url.encode()).hexdigest()[:12]


def group_tasks(tasks: list[ShardTask], limit: int = MAX_ARRAY_TASKS) -> list[list[ShardTask]]:
    """`tasks` cut into at most `limit` contiguous runs of nearly equal length."""
    groups = min(limit, len(tasks))
    size, extra = divmod(len(tasks), groups)
    out, start = [], 0
    for g in range(groups):
        end = start + size + (1 if g < extra else 0)
        out.append(tasks[start:end])
        start = end
    return out


def run_on_slurm(
    tasks: list[ShardTask],
    options: SlurmOptions,
    parallelism: int | None,
    folder: Path,
    advance: Callable[[int], None],
) -> tuple[dict[int, ShardResult], dict[int, str]]:
    """Run the writers of `tasks` as one array and wait for it; failures by shard."""
    import submitit

    groups = group_tasks(tasks)
    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    parameters: dict[str, object] = {
        "name": "stoker-pack",
        "timeout_min": options.time_min,
        "cpus_per_task": options.cpus_per_task,
        "slurm_array_parallelism": parallelism or len(groups),
    }
    if options.partition:
        parameters["slurm_partition"] = options.partition
    executor.update_parameters(**parameters)
    try:
        with executor.batch():
            jobs = [executor.submit(write_planned_shards, group) for group in groups]
    except Exception as exc:  # sbatch refused: submitit wraps its stderr in various types
        raise StokerError(
            f"sbatch refused the pack array: {exc}",
            fix="check --partition, --time-min and --cpus-per-task against `sinfo`; "
            f"submitit's files are in {folder}",
        ) from exc

    results: dict[int, ShardResult] = {}
    failures: dict[int, str] = {}
    waiting = dict(enumerate(jobs))
    try:
        while waiting:
            for i, job in list(waiting.items()):
                if not job.done():
                    continue
                del waiting[i]
                try:
                    for result in job.result():
                        results[result.number] = result
                except Exception as exc:  # the task failed, timed out or was killed
                    last = str(exc).strip().splitlines()[-1:] or [type(exc).__name__]
                    why = f"array task {job.job_id} failed ({last[0]}); log: {job.paths.stderr}"
                    for task in groups[i]:
                        if task.number not in results:
                            failures[task.number] = why
                advance(len(groups[i]))
            if waiting:
                time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        for job in waiting.values():
            job.cancel(check=False)
        raise
    return results, failures
