"""Data jobs (`stoker data encode --slurm`, `stoker data pack --slurm`) as SLURM job
arrays through stoker's own launcher: the same path as `stoker sweep`, so a data job
has a run folder, a code snapshot, a ledger entry, per-task logs, requeue on
preemption and restarts on a lost node, and `stoker status`, `logs`, `why` and
`cancel` know it. The command returns with the job id at once.

Each array task runs `python -m <module> ... --work WORK --task $SLURM_ARRAY_TASK_ID`:
the work file (written under the destination before the job is queued) lists each
task's share; a task skips what is already on storage, so a requeued or re-run task
does only the rest. The tasks run this machine's Python (`sys.executable`), so the
nodes must see it and its packages (the usual shared-filesystem install).
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.errors import StokerError
from stoker.launcher.launch.job_flags import JobFlags, command_line
from stoker.launcher.script.render import Shell

if TYPE_CHECKING:
    from stoker.data.encode.pipeline import EncodeRequest
    from stoker.data.pack.pipeline import PackRequest, PreparedPack
    from stoker.launcher.launch.submit import Submitted

DEFAULT_MAX_TASKS = 100
"""Array tasks when --tasks is not given: one per shard up to this many (each task has
its own run folder and MLflow run; more tasks than that buy little for a data job)."""


@dataclass(frozen=True)
class ArrayOptions:
    """The command line's SLURM flags of a data job."""

    tasks: int | None = None
    slurm: JobFlags = field(default_factory=JobFlags)
    """Each task's SLURM options (`--partition`, `--time`, `--gpus-per-node`, ...); its
    job name and one task per array task are the array's own."""
    max_parallel: int | None = None
    cwd: Path | None = None
    """The folder snapshotted and run from (the encoder's code); default: the current one."""
    snapshot: bool = True
    """False: run from `cwd` itself, no copy of it (a job that runs none of the user's
    code: a snapshot would only copy, and refuse, what lies there)."""


def group_evenly(items: Sequence[int], groups: int) -> list[list[int]]:
    """`items` cut into `groups` contiguous runs of nearly equal length (none empty)."""
    groups = max(1, min(groups, len(items)))
    size, extra = divmod(len(items), groups)
    out, start = [], 0
    for g in range(groups):
        end = start + size + (1 if g < extra else 0)
        out.append(list(items[start:end]))
        start = end
    return out


@dataclass(frozen=True)
class DataJob:
    """What a data command planned: the job's name and task module, where it writes,
    the shards still to write, and what its tasks need beyond the plan under DST."""

    name: str
    module: str
    dst_fs: Any
    dst_root: str
    dst_url: str
    pending: Sequence[int]
    work_dir: str
    """The folder under DST for the work files."""
    work: dict[str, Any]
    """Extra entries of the work file (besides "groups")."""


def submit_data_array(job: DataJob, options: ArrayOptions) -> Submitted:
    """Write the work file (`job.pending` cut into one group of shards per task) under
    DST, then queue `python -m MODULE DST --work WORK_URL --task $SLURM_ARRAY_TASK_ID`
    as an array of one task per group. A refusal by SLURM leaves the work file,
    harmless, for the next try."""
    from stoker.config import resolve_config
    from stoker.data.format.shard_format import join
    from stoker.data.write.shard_writer import write_json_atomic
    from stoker.launcher.launch.submit import SubmitOptions, submit

    groups = group_evenly(job.pending, options.tasks or min(len(job.pending), DEFAULT_MAX_TASKS))
    flags = options.slurm.for_config(command_line)
    # One process per array task, whatever its GPUs: the task's encoder uses them.
    resolved = resolve_config(None, [f"job.name={job.name}", "job.ntasks_per_node=1"], flags)
    work_path = join(job.dst_root, f"{job.work_dir}/{work_name()}")
    work_url = job.dst_fs.unstrip_protocol(work_path)
    job.dst_fs.makedirs(work_path.rsplit("/", 1)[0], exist_ok=True)
    body = json.dumps({"groups": groups, **job.work}, indent=1) + "\n"
    write_json_atomic(job.dst_fs, work_path, body.encode())
    command: list[str | Shell] = [
        sys.executable,
        "-m",
        job.module,
        job.dst_url,
        "--work",
        work_url,
        "--task",
        Shell('"$SLURM_ARRAY_TASK_ID"'),
    ]
    submit_options = SubmitOptions(
        command=command,
        check=False,
        snapshot=options.snapshot,
        max_parallel=options.max_parallel,
        cwd=options.cwd or Path.cwd(),
    )
    return submit(
        [resolved] * len(groups),
        submit_options,
        sweep_params=[{"data.shards": _ranges(group)} for group in groups],
    )


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5': a task's shards as its MLflow tag shows them."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ",".join(parts)


def work_name() -> str:
    """A work file's name: when it was made, and a random tail (two submits never share)."""
    return f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}.json"


def submit_encode(request: EncodeRequest, options: ArrayOptions) -> Submitted | None:
    """`stoker data encode --slurm`: plan (or check) the encode here, then queue the
    shards not encoded yet as an array; None when none is left."""
    from stoker.data.encode.pipeline import WORK_DIR, prepare
    from stoker.data.pack.pipeline import process_local
    from stoker.data.write.location import open_location

    if any(process_local(open_location(url)[0]) for url in (request.src, request.dst)):
        raise StokerError(
            "--slurm cannot encode memory://: that filesystem exists only in this process",
            fix="encode to and from storage the SLURM nodes see, or drop --slurm",
        )
    prepared = prepare(request)
    if not prepared.pending:
        return None
    job = DataJob(
        "stoker-encode",
        "stoker.data.jobs.encode_task",
        prepared.dst_fs,
        prepared.dst_root,
        prepared.dst_url,
        prepared.pending,
        WORK_DIR,
        {"batch_size": request.batch_size, "device": request.device},
    )
    return submit_data_array(job, options)


def submit_pack(
    request: PackRequest, options: ArrayOptions, *, prepared: PreparedPack | None = None
) -> Submitted | None:
    """`stoker data pack --slurm`: list SRC and plan the pack here (or check the plan
    under DST), then queue the shards not written yet as an array; None when none is
    left. `prepared`: the pack as `prepare_pack(request)` already planned it."""
    from stoker.data.pack.pipeline import WORK_DIR, plan_digest, prepare_pack, process_local
    from stoker.data.write.location import open_location

    if any(process_local(open_location(url)[0]) for url in (request.src, request.dst)):
        raise StokerError(
            "--slurm cannot pack memory://: that filesystem exists only in this process",
            fix="pack to and from storage the SLURM nodes see, or drop --slurm",
        )
    planned = prepared or prepare_pack(request)
    if not planned.pending:
        return None
    job = DataJob(
        "stoker-pack",
        "stoker.data.jobs.pack_task",
        planned.dst_fs,
        planned.dst_root,
        planned.dst_url,
        planned.pending,
        WORK_DIR,
        # The tasks run elsewhere (another node, the job's folder): SRC by absolute URL.
        {"src_url": planned.src_url, "plan_sha256": plan_digest(planned.plan)},
    )
    # The tasks run stoker's own code only: no snapshot of the current folder (media
    # under it would be copied, or refused as too big).
    return submit_data_array(job, replace(options, snapshot=False))
