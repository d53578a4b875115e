"""The facts `stoker why` judges, gathered once (`gather_facts`):

scontrol show job -o ID      one call, while slurmctld still knows the job
sacct -j ID -n -P ...        one call, the job and its steps (not -X): State,
                             ExitCode, MaxRSS, ReqMem, Timelimit, Elapsed, End
                             (both through stoker/launcher/slurm/query.py)
logs/batch.log               srun's "task N: Exited with exit code X" lines (the
                             first is the first failure: --kill-on-bad-exit kills
                             the others after it), slurmstepd's "*** ... DUE TO
                             TIME LIMIT ***" and memory-limit messages
logs/r<R>/rank-<T>.log       of the last restart: the failing rank's traceback,
                             signatures (why/signatures.py), and each file's mtime
                             (a rank silent long before the end has hung)
events                       the batch script's stop, requeue and restart decisions
heartbeat/r<R>/hang.json     the hang watchdog's report, when it failed the job
local-state.json             instead of SLURM for `--local` jobs
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.launcher.jobs.log_text import split_batch_by_restart
from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.jobs.targets import Target
from stoker.launcher.local.state import process_alive, read_local_state
from stoker.launcher.slurm.cli import SlurmError
from stoker.launcher.slurm.query import (
    PENDING_STATES,
    RUNNING_STATES,
    ScontrolJob,
    StepRow,
    query_job,
    query_steps,
)
from stoker.launcher.why.collectives import Laggard, find_laggard, read_traces
from stoker.launcher.why.tracebacks import first_failure, parse_task_failures
from stoker.protocol import HANG_FILE, HEARTBEAT_DIR

# How much of each log is read: tracebacks and signatures are at the end.
FAILING_RANK_TAIL_BYTES = 256 * 1024
OTHER_RANK_TAIL_BYTES = 64 * 1024
MAX_RANKS_SCANNED = 512


@dataclass
class JobFacts:
    """Everything `judge` looks at, gathered once."""

    job_id: str
    backend: str = "slurm"
    state: str = "UNKNOWN"
    reason: str | None = None  # scontrol's Reason: why pending, or how it ended
    exit_code: int | None = None  # the batch script's
    exit_signal: int | None = None
    cancelled_by: int | None = None  # uid
    elapsed_s: int | None = None
    time_limit_s: int | None = None
    end_time: float | None = None
    node_list: str | None = None
    req_mem: int | None = None  # bytes per node (ReqMem)
    req_mem_text: str | None = None
    restarts: int = 0  # SLURM's restart count (requeues)
    steps: list[StepRow] = field(default_factory=list)
    restart: int = 0  # the restart whose logs were read
    batch_log: str = ""  # that restart's part of batch.log
    rank_logs: dict[int, str] = field(default_factory=dict)  # tails
    rank_mtimes: dict[int, float] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)  # all restarts
    restart_started: float | None = None  # epoch start of `restart`, from `attempts`
    stop_grace_s: int | None = None  # from the job script's --signal=B:USR2@N
    local_ranks: dict[int, int | None] = field(default_factory=dict)
    supervisor_died: bool = False
    hang: dict[str, Any] | None = None  # the watchdog's hang.json of that restart
    laggard: Laggard | None = None  # from the ranks' flight-recorder dumps of that restart
    notes: list[str] = field(default_factory=list)  # what could not be asked
    slurm_forgot: bool = False  # slurmctld no longer knows it: it cannot be requeued
    checkpoint_root: str = ""  # where its checkpoints are (checkpoint.root or its default)
    checkpoint_root_set: bool = False  # checkpoint.root set in its config: a new run finds it


def _read_tail(path: Path, limit: int) -> str:
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - limit))
            data = handle.read()
    except OSError:
        return ""
    if size > limit:
        data = data.split(b"\n", 1)[-1]  # drop the cut first line
    return data.decode("utf-8", errors="replace")


def read_run_logs(facts: JobFacts, run: RunDir, failing_hint: int | None = None) -> None:
    """The last restart's batch.log part, rank log tails and mtimes, and events."""
    restarts = run.restarts_logged()
    facts.restart = restarts[-1] if restarts else 0
    try:
        batch_lines = run.batch_log.read_text(errors="replace").splitlines()
    except OSError:
        batch_lines = []
    facts.batch_log = "\n".join(
        split_batch_by_restart(batch_lines, restarts).get(facts.restart, [])
    )
    logs = run.rank_logs(facts.restart)
    failing = parse_task_failures(facts.batch_log)
    first = first_failure(failing)
    hint = first.ranks[0] if first and first.ranks else failing_hint
    for index, (rank, path) in enumerate(logs.items()):
        if index >= MAX_RANKS_SCANNED and rank != hint:
            continue
        limit = FAILING_RANK_TAIL_BYTES if rank == hint else OTHER_RANK_TAIL_BYTES
        facts.rank_logs[rank] = _read_tail(path, limit)
        mtime = _mtime(path)
        if mtime is not None:
            facts.rank_mtimes[rank] = mtime
    try:
        facts.events = run.events.read_text(errors="replace").splitlines()
    except OSError:
        facts.events = []
    facts.restart_started = _restart_started(run, facts.restart)
    facts.stop_grace_s = _stop_grace(run)
    facts.hang = _hang_report(run, facts.restart)
    facts.laggard = find_laggard(read_traces(run.path, facts.restart))
    hung = facts.hang.get("rank") if facts.hang else None
    if isinstance(hung, int) and hung in logs and hung != hint:
        facts.rank_logs[hung] = _read_tail(logs[hung], FAILING_RANK_TAIL_BYTES)


def _hang_report(run: RunDir, restart: int) -> dict[str, Any] | None:
    path = run.path / HEARTBEAT_DIR / f"r{restart}" / HANG_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "message" in data else None


def _restart_started(run: RunDir, restart: int) -> float | None:
    try:
        lines = run.attempts.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        stamp, _, rest = line.partition(" ")
        if f"restart={restart}" in rest.split() and stamp.isdigit():
            return float(stamp)
    return None


def _stop_grace(run: RunDir) -> int | None:
    # The script is in the job's own folder; an array task's is its parent's.
    for script in (run.script, run.path.parent.parent / "job.sbatch"):
        try:
            match = re.search(r"^#SBATCH --signal=B?:?USR2@(\d+)", script.read_text(), re.M)
        except OSError:
            continue
        if match:
            return int(match.group(1))
    return None


def gather_facts(target: Target) -> JobFacts:
    """Ask SLURM (one scontrol and one sacct call) or the local state file, and read
    the run folder. Never raises for a scheduler that does not answer: `notes` says."""
    facts = JobFacts(job_id=target.job_id, backend=target.record.backend)
    run = target.run
    if target.record.backend == "local":
        _local_facts(facts, target)
    else:
        _slurm_facts(facts, target)
    read_run_logs(facts, run)
    facts.checkpoint_root = run.checkpoint_root()
    facts.checkpoint_root_set = run.configured_checkpoint_root() is not None
    if facts.end_time is None and facts.state not in RUNNING_STATES | PENDING_STATES:
        mtimes = [m for m in [*facts.rank_mtimes.values(), _mtime(run.batch_log)] if m]
        facts.end_time = max(mtimes) if mtimes else None
    return facts


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _local_facts(facts: JobFacts, target: Target) -> None:
    local = read_local_state(target.run)
    if local is None:
        facts.state = target.record.final_state or "UNKNOWN"
        facts.notes.append("no local-state.json in the run folder")
        return
    facts.state = local.state
    facts.exit_code = local.exit_code
    facts.local_ranks = dict(local.ranks)
    facts.end_time = local.ended
    if local.started is not None:
        facts.elapsed_s = int((local.ended or time.time()) - local.started)
    pid = local.supervisor_pid
    if local.state == "RUNNING" and pid is not None and not process_alive(pid, local.started):
        facts.supervisor_died = True
        facts.state = "FAILED"


def _slurm_facts(facts: JobFacts, target: Target) -> None:
    job_id = target.job_id
    live: ScontrolJob | None = None
    try:
        live = query_job(job_id)
    except SlurmError as exc:
        facts.notes.append(f"scontrol: {exc.message.splitlines()[0]}")
    try:
        rows = query_steps(job_id)
    except SlurmError as exc:
        rows = []
        facts.notes.append(f"sacct: {exc.message.splitlines()[0]}")
    job_rows = [r for r in rows if r.is_job]
    facts.steps = [r for r in rows if not r.is_job]
    acct = job_rows[-1] if job_rows else None
    if acct is not None:
        facts.state = acct.state
        facts.cancelled_by = acct.cancelled_by
        facts.exit_code, facts.exit_signal = acct.exit_code, acct.signal
        facts.elapsed_s, facts.time_limit_s = acct.elapsed_s, acct.time_limit_s
        facts.end_time, facts.node_list = acct.end, acct.node_list
        facts.req_mem, facts.req_mem_text = acct.req_mem, acct.req_mem_text
    if live is not None:
        # scontrol is fresher than accounting while slurmctld still knows the job.
        facts.state = live.state or facts.state
        facts.reason = live.reason
        if facts.exit_code is None:
            facts.exit_code, facts.exit_signal = live.exit_code, live.signal
        facts.elapsed_s = live.elapsed_s or facts.elapsed_s
        facts.time_limit_s = live.time_limit_s or facts.time_limit_s
        if facts.state not in RUNNING_STATES | PENDING_STATES and live.end is not None:
            facts.end_time = facts.end_time or live.end
        if live.node_list:
            facts.node_list = live.node_list
        facts.restarts = live.restarts
        if facts.req_mem is None and live.min_mem:
            facts.req_mem, facts.req_mem_text = live.min_mem, live.min_mem_text
    facts.slurm_forgot = live is None and not any("scontrol:" in n for n in facts.notes)
    if acct is None and live is None:
        if target.record.final_state:
            facts.state = target.record.final_state
            facts.notes.append("SLURM no longer knows the job; state from the ledger")
        else:
            facts.notes.append("SLURM knows nothing of the job (accounting off or purged)")
