"""What `stoker status` shows: one row per job (or array task) of the ledger.

One refresh makes at most one `squeue` and one `sacct` call, whatever the number
of jobs (stoker/launcher/slurm/query.py). Where each value comes from:

    state, reason, nodes, elapsed   squeue for live jobs (fresher), sacct for ended ones;
                                    a final state once seen is kept in the ledger with
                                    its elapsed time, and the job is not queried again
                                    (as submitit's watcher does); an ended job kept
                                    without one (an older ledger) is asked of sacct once
    restarts                        the largest of: the run folder's `attempts` file (in
                                    place and requeued), the ledger, squeue's RestartCnt,
                                    sacct's requeued attempts
    reason of a running job         its latest restart, from the run folder's `events`
    spares                          the latest attempt's spare nodes (`attempts`)
    step, loss, throughput, ETA     the run folder's progress.json (below)
    straggler                       progress.json's slowest rank, when its ratio is above
                                    STRAGGLER_RATIO after STRAGGLER_MIN_STEPS steps of the
                                    start (stoker.protocol.is_straggler)
    local jobs (backend "local")    the run folder's local-state.json
                                    (stoker/launcher/local/state.py); no SLURM call

Without accounting (sacct missing or failing) ended jobs that squeue has already
forgotten show their cached final state, else "UNKNOWN"; `StatusReport.notes`
says so.

progress.json, written by the runtime's global rank 0 (whole-file replace); every
key is optional and a missing or unreadable file shows as "-":

    step          int    optimizer steps done so far
    total_steps   int    steps the run will take
    loss          float  last training loss
    samples_per_s float  throughput; else tokens_per_s (float) is shown
    eta_s         float  seconds left, as the runtime estimated it at `time`
    time          float  epoch seconds when the record was written
    started       float  epoch seconds when this start (restart) of the job began;
                         default: the last line of the `attempts` file
    start_step    int    step this start resumed from; default 0 on the first start

and, from jobs with several ranks, the last log window's slowest rank: the one that took
longest to be ready for the step's all-reduce (data wait + forward, backward, clipping;
stoker/runtime/observe/stragglers.py), mean seconds per step:

    slowest_rank        int    its global rank
    slowest_host        str    its node (SLURMD_NODENAME, else the host name)
    slowest_ratio       float  slowest_step_s / median_step_s
    slowest_step_s      float  its time per step;  median_step_s  float  the median rank's
    slowest_data_wait_s float  its data wait;      median_data_wait_s float  the median rank's

ETA (running jobs only): `eta_s` minus the time since `time`; without `eta_s`,
the steps left divided by the step rate of this start,
(step - start_step) / (time - started).

A local job RUNNING whose supervisor process is gone reads as FAILED, reason
"supervisor died" (what NODE_FAIL is on a cluster).
"""

from __future__ import annotations

import math
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from stoker.launcher.jobs.json_fields import int_field, number_field
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.jobs.targets import Target, targets_of
from stoker.launcher.local.state import process_alive, read_local_state
from stoker.launcher.slurm.cli import SlurmError
from stoker.launcher.slurm.query import (
    TERMINAL_STATES,
    AcctRow,
    QueueRow,
    count_hosts,
    query_accounting,
    query_queue,
)
from stoker.launcher.watch.job_end import Ended, settle
from stoker.protocol import is_straggler

# A sacct row submitted this long before the ledger recorded the job belongs to an
# older job with the same id (job ids restart when slurmctld loses its state).
_CLOCK_SLACK_S = 120.0


@dataclass
class JobStatus:
    """One row of `stoker status` (`--json` prints these fields)."""

    job_id: str
    name: str
    backend: str
    state: str
    reason: str | None  # why it is pending, or how it ended when not well
    nodes: int | None
    node_list: str | None
    elapsed_s: int | None
    restarts: int
    exit_code: int | None
    step: int | None
    total_steps: int | None
    loss: float | None
    throughput: float | None
    throughput_unit: str | None  # "samples/s" or "tokens/s"
    eta_s: float | None
    run_dir: str
    mlflow_run_id: str | None
    source: str  # where the state came from: squeue, sacct, ledger, local, none
    # The last log window's slowest rank (progress.json; jobs with several ranks).
    straggler: bool  # slowest_ratio > STRAGGLER_RATIO, after STRAGGLER_MIN_STEPS (is_straggler)
    slowest_rank: int | None
    slowest_host: str | None
    slowest_ratio: float | None
    straggler_cause: str | None  # a straggler's: "data" (its loader) or "compute" (GPU, node)
    spares: str | None = None  # the allocation's nodes the latest attempt holds in reserve

    def to_json(self) -> dict[str, Any]:
        """The row as JSON values; a NaN or infinite loss (a diverged run) becomes null,
        which strict JSON readers accept (the table shows "nan")."""
        data = asdict(self)
        for key in ("loss", "slowest_ratio"):
            if data[key] is not None and not math.isfinite(data[key]):
                data[key] = None
        return data


@dataclass
class StatusReport:
    rows: list[JobStatus]
    notes: list[str]  # caveats for stderr, e.g. that accounting is unavailable


@dataclass(frozen=True)
class _SchedulerView:
    state: str
    reason: str | None
    nodes: int | None
    node_list: str | None
    elapsed_s: int | None
    restarts: int
    exit_code: int | None
    source: str


# ---------------------------------------------------------------- collection


def collect_status(
    targets: Sequence[Target], ledger: Ledger, *, now: float | None = None
) -> StatusReport:
    """State, progress and restarts of `targets` from one squeue and at most one sacct call.

    Final states and restart counts learned here are written back to the ledger.
    Raises SlurmError only when neither squeue nor sacct answers.
    """
    now = time.time() if now is None else now
    notes: list[str] = []
    records = {t.record.job_id: t.record for t in targets}
    to_query = [
        job_id for job_id, r in records.items() if r.backend != "local" and r.final_state is None
    ]
    # Ended and kept without their elapsed time: sacct only, in the same call.
    untimed = [
        job_id
        for job_id, r in records.items()
        if r.backend != "local" and r.final_state is not None and ELAPSED_KEY not in r.extra
    ]

    queue: dict[str, QueueRow] = {}
    accounting: dict[str, list[AcctRow]] | None = {}
    queue_error: SlurmError | None = None
    if to_query:
        try:
            queue = query_queue(to_query)
        except SlurmError as exc:
            queue_error = exc
    if to_query or untimed:
        try:
            accounting = query_accounting([*to_query, *untimed])
        except SlurmError as exc:
            # Without live jobs, only elapsed times were asked: they stay unknown ("-").
            accounting = None if to_query else {}
            reason = exc.message.splitlines()[0]
            if to_query:
                notes.append(
                    f"accounting unavailable ({reason}): the state of jobs that ended more "
                    "than a few minutes ago is unknown or approximate (from squeue and the "
                    "ledger)"
                )
        if queue_error is not None:
            if accounting is None:
                raise queue_error
            notes.append(
                f"the queue is unavailable ({queue_error.message.splitlines()[0]}): "
                "states come from accounting and may lag"
            )

    views: dict[str, _SchedulerView | None] = {}
    for job_id in to_query:
        record = records[job_id]
        for target in targets_of(record):
            views[target.job_id] = _scheduler_view(
                target.job_id, queue, accounting, record.submitted_at
            )
    accounted_elapsed = {
        target.job_id: view.elapsed_s
        for job_id in untimed
        for target in targets_of(records[job_id])
        for view in [_scheduler_view(target.job_id, {}, accounting, records[job_id].submitted_at)]
        if view is not None
    }
    rows = [_row(t, views, accounting is not None, now, accounted_elapsed) for t in targets]
    _write_back(ledger, targets, rows, views)
    # An ended job's REASON is `stoker why`'s headline, and its MLflow run is ended.
    # Those whose end this call saw: a state kept in the ledger was settled when it was
    # first seen (`settle` reads what was kept, asks SLURM nothing more for them).
    ended = [
        Ended(t, row.state, judge=row.source != "ledger")
        for t, row in zip(targets, rows, strict=True)
    ]
    reasons = settle(ledger, ended, accounting=accounting, asked=bool(to_query))
    for row in rows:
        row.reason = reasons.get(row.job_id, row.reason)
    return StatusReport(rows=rows, notes=notes)


# The ledger's `extra` key of ended jobs' elapsed seconds, by target job id.
ELAPSED_KEY = "elapsed"


def _scheduler_view(
    job_id: str,
    queue: dict[str, QueueRow],
    accounting: dict[str, list[AcctRow]] | None,
    submitted_at: float,
) -> _SchedulerView | None:
    live = queue.get(job_id)
    attempts = [
        row
        for row in (accounting or {}).get(job_id, [])
        if row.submitted is None or row.submitted >= submitted_at - _CLOCK_SLACK_S
    ]
    last = attempts[-1] if attempts else None
    restarts = max(live.restarts if live else 0, len(attempts) - 1)
    use_queue = live is not None and (
        live.state not in TERMINAL_STATES or last is None or last.state not in TERMINAL_STATES
    )
    if live is not None and use_queue:
        return _SchedulerView(
            state=live.state,
            reason=live.reason if live.state == "PENDING" else None,
            nodes=live.nodes,
            node_list=live.node_list,
            elapsed_s=live.elapsed_s,
            restarts=restarts,
            exit_code=None,
            source="squeue",
        )
    if last is not None:
        return _SchedulerView(
            state=last.state,
            reason=_acct_reason(last),
            nodes=last.nodes,
            node_list=last.node_list,
            elapsed_s=last.elapsed_s,
            restarts=restarts,
            exit_code=last.exit_code,
            source="sacct",
        )
    return None


def _acct_reason(row: AcctRow) -> str | None:
    if row.state == "PENDING":
        return row.reason
    if row.signal:
        return f"signal {row.signal}"
    if row.state in TERMINAL_STATES and row.exit_code:
        return f"exit {row.exit_code}"
    return None


def _row(
    target: Target,
    views: dict[str, _SchedulerView | None],
    accounted: bool,
    now: float,
    accounted_elapsed: dict[str, int | None],
) -> JobStatus:
    record = target.record
    run = target.run
    progress = run.read_progress() or {}
    restarts = run.restarts()
    if target.task is None:
        restarts = max(restarts, record.restarts)
    exit_code: int | None = None
    node_list = _attempt_nodes(run)
    nodes = count_hosts(node_list) if node_list else None
    elapsed: int | None = None
    reason: str | None = None

    if record.backend == "local":
        state, reason, exit_code, elapsed, source = _local_status(record, run, now)
        nodes, node_list = 1, record.cluster
    elif target.job_id in views:
        view = views[target.job_id]
        if view is not None:
            state, reason, source = view.state, view.reason, view.source
            nodes = view.nodes if view.nodes is not None else nodes
            node_list = view.node_list or node_list
            elapsed, exit_code = view.elapsed_s, view.exit_code
            restarts = max(restarts, view.restarts)
        else:
            state, source = "UNKNOWN", "none"
            reason = "not in squeue or sacct" if accounted else "accounting unavailable"
    else:  # final state cached: not queried again
        state, source = record.final_state or "UNKNOWN", "ledger"
        kept = record.extra.get(ELAPSED_KEY)
        elapsed = (
            kept.get(target.job_id)
            if isinstance(kept, dict)
            else accounted_elapsed.get(target.job_id)
        )
    if state == "RUNNING" and reason is None and restarts:
        reason = _latest_restart(run)

    throughput, unit = _throughput(progress)
    ratio = number_field(progress, "slowest_ratio")
    step, start_step = int_field(progress, "step"), int_field(progress, "start_step")
    straggler = is_straggler(ratio, step - (start_step or 0) if step is not None else None)
    host = progress.get("slowest_host")
    return JobStatus(
        job_id=target.job_id,
        name=record.name,
        backend=record.backend,
        state=state,
        reason=reason,
        nodes=nodes,
        node_list=node_list,
        elapsed_s=elapsed,
        restarts=restarts,
        exit_code=exit_code,
        step=int_field(progress, "step"),
        total_steps=int_field(progress, "total_steps"),
        loss=number_field(progress, "loss"),
        throughput=throughput,
        throughput_unit=unit,
        eta_s=_eta(progress, run, restarts, now) if state == "RUNNING" else None,
        run_dir=str(run.path),
        mlflow_run_id=target.mlflow_run_id,
        source=source,
        straggler=straggler,
        slowest_rank=int_field(progress, "slowest_rank"),
        slowest_host=host if isinstance(host, str) else None,
        slowest_ratio=ratio,
        straggler_cause=_straggler_cause(progress) if straggler else None,
        spares=_attempt_field(run, "spares") if state == "RUNNING" else None,
    )


def _write_back(
    ledger: Ledger,
    targets: Sequence[Target],
    rows: Sequence[JobStatus],
    views: dict[str, _SchedulerView | None],
) -> None:
    """Cache final states and restart counts, one ledger write per changed job.

    An array's final state is cached only when every task ended in the same state;
    mixed outcomes stay per task and are queried again (the ledger has one state per job).
    """
    restarts: dict[str, int] = {}
    for target, row in zip(targets, rows, strict=True):
        job_id = target.record.job_id
        restarts[job_id] = max(restarts.get(job_id, 0), row.restarts)
    records = {t.record.job_id: t.record for t in targets}
    changes: dict[str, tuple[int | None, str | None]] = {}
    for job_id, record in records.items():
        final: str | None = None
        if record.final_state is None:
            if record.backend == "local":
                final = next(
                    (r.state for r in rows if r.job_id == job_id and r.state in TERMINAL_STATES),
                    None,
                )
            else:
                states = {
                    view.state if view else None
                    for target in targets_of(record)
                    for view in [views.get(target.job_id)]
                }
                if len(states) == 1:
                    (only,) = states
                    final = only if only in TERMINAL_STATES else None
        more_restarts = restarts[job_id] if restarts[job_id] > record.restarts else None
        if final is not None or more_restarts is not None:
            changes[job_id] = (more_restarts, final)
    ledger.update_many(changes)
    # The elapsed time of each target of a job now kept as ended (None: sacct had none),
    # so that `status` shows it without asking SLURM again.
    elapsed: dict[str, dict[tuple[str, ...], Any]] = {}
    for target, row in zip(targets, rows, strict=True):
        record = target.record
        newly_final = record.job_id in changes and changes[record.job_id][1] is not None
        untimed = record.final_state is not None and ELAPSED_KEY not in record.extra
        if record.backend != "local" and (newly_final or untimed):
            elapsed.setdefault(record.job_id, {})[(ELAPSED_KEY, target.job_id)] = row.elapsed_s
    ledger.set_extra(elapsed)


# ---------------------------------------------------------------- run folder


def _attempt_nodes(run: RunDir) -> str | None:
    """The node list of the latest attempt, from the `attempts` file."""
    return _attempt_field(run, "nodes")


def _attempt_field(run: RunDir, name: str) -> str | None:
    """A field (`nodes=`, `spares=`) of the latest attempt's line in `attempts`."""
    try:
        lines = run.attempts.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        if "restart" in fields:
            return fields.get(name) or None
    return None


def _latest_restart(run: RunDir) -> str | None:
    """A running job's latest restart as the batch script told it (`events`): "restarted
    in place without n3 after 'n3: task 1: Killed' (9 s to the first step)", or, before
    the new attempt's first step, the decision ("restarting in place after ...")."""
    try:
        lines = run.events.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.partition(" ")[2]
        if text.startswith(("restarted ", "restarting ")):
            return text
    return None


def _attempt_started(run: RunDir) -> float | None:
    """Epoch seconds of the latest start, from the `attempts` file."""
    try:
        lines = run.attempts.read_text().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        first = line.split(maxsplit=1)[0] if line.strip() else ""
        try:
            return float(first)
        except ValueError:
            continue
    return None


def _throughput(progress: dict[str, Any]) -> tuple[float | None, str | None]:
    for key, unit in (("samples_per_s", "samples/s"), ("tokens_per_s", "tokens/s")):
        value = number_field(progress, key)
        if value is not None:
            return value, unit
    return None, None


def _straggler_cause(progress: dict[str, Any]) -> str | None:
    """`data` when the slowest rank's extra data wait makes at least half of its extra
    time over the median rank, else `compute`; None without the numbers."""
    step_s, median_step_s = (
        number_field(progress, "slowest_step_s"),
        number_field(progress, "median_step_s"),
    )
    data_s, median_data_s = (
        number_field(progress, "slowest_data_wait_s"),
        number_field(progress, "median_data_wait_s"),
    )
    if step_s is None or median_step_s is None or data_s is None or median_data_s is None:
        return None
    return "data" if data_s - median_data_s >= 0.5 * (step_s - median_step_s) else "compute"


def _eta(progress: dict[str, Any], run: RunDir, restarts: int, now: float) -> float | None:
    written = number_field(progress, "time")
    since = max(0.0, now - written) if written is not None else 0.0
    eta = number_field(progress, "eta_s")
    if eta is not None:
        return max(0.0, eta - since)
    step = int_field(progress, "step")
    total = int_field(progress, "total_steps")
    if step is None or total is None or written is None:
        return None
    started = number_field(progress, "started") or _attempt_started(run)
    start_step = int_field(progress, "start_step")
    if start_step is None and restarts == 0:
        start_step = 0
    if started is None or start_step is None or step <= start_step or written <= started:
        return None
    rate = (step - start_step) / (written - started)
    return max(0.0, (total - step) / rate - since)


# ---------------------------------------------------------------- local backend


def _local_status(
    record: JobRecord, run: RunDir, now: float
) -> tuple[str, str | None, int | None, int | None, str]:
    """(state, reason, exit code, elapsed seconds, source) of a local-backend job."""
    local = read_local_state(run)
    if local is None:
        if record.final_state:
            return record.final_state, None, None, None, "ledger"
        return "UNKNOWN", f"no {run.local_state.name} in the run folder", None, None, "none"
    state, reason, ended = local.state, None, local.ended
    if state == "RUNNING" and local.supervisor_pid is not None:
        if record.cluster != socket.gethostname():
            reason = f"runs on {record.cluster}; cannot check its supervisor from here"
        elif not process_alive(local.supervisor_pid, local.started):
            state, reason = "FAILED", "supervisor died"
            ended = _mtime(run.local_state)
    elif state == "FAILED":
        failed = sorted(rank for rank, code in local.ranks.items() if code)
        if failed:
            reason = f"rank {failed[0]} exited {local.ranks[failed[0]]}"
        elif local.exit_code:
            reason = f"exit {local.exit_code}"
    elapsed = None
    if local.started is not None:
        elapsed = int(max(0.0, (ended or now) - local.started))
    return state, reason, local.exit_code, elapsed, "local"


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None
