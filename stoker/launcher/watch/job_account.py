"""A job's account for `stoker insights`: made once, when `status`, `why`, `logs` or
`insights` first sees the job ended, and kept in the ledger (`extra["accounts"]`, by job
or array task id), so a report over thousands of jobs reads the ledger alone.

It joins three records of the job:

    the run folder   its time account (stoker/job_time.py): productive and lost time
                     by cause, throughput, MFU, the hosts that straggled; the batch
                     script's `failures` (the node each restart left out and why) and
                     each start's hang.json (the host the watchdog blamed)
    sacct -D         each attempt's Start and End (the allocation, to the second), the
                     partition, the user, a NODE_FAIL's node
    the diagnosis    `stoker why`'s cause (time-limit, gpu-oom, hung, node-failure...)

Hours are resource-hours: a rank's seconds times the GPUs it holds (job.gpus_per_node
over its ranks per node), or its CPUs (job.cpus_per_task) for a CPU job.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.job_time import CAUSES, job_time, read_attempt_lines
from stoker.launcher.jobs.targets import Target
from stoker.launcher.slurm.query import AcctRow
from stoker.metric_names import goodput_metrics
from stoker.protocol import HANG_FILE, HEARTBEAT_DIR, expand_nodelist, runs_the_runtime

ACCOUNTS_KEY = "accounts"
"""The ledger's `extra` key of the accounts, by job (or array task) id."""
FORMAT = 1
"""Bumped when an account's fields change: older ones are made again."""
STRAGGLER_WINDOWS = 2
"""A host that held the straggler in this many log windows of one job is named."""

# The end states of jobs that did not fail: done, or stopped by someone on purpose.
NOT_FAILED_STATES = frozenset({"COMPLETED", "CANCELLED"})

# What a node is named for (NodeBlame.kind).
NODE_DOWN = "node down"
NODE_FAILURE = "node failure"
HANG = "hang"
KILLED_TASK = "killed task"
STRAGGLER = "straggler"
BLAME_KINDS = (NODE_DOWN, NODE_FAILURE, HANG, KILLED_TASK, STRAGGLER)


@dataclass(frozen=True)
class NodeBlame:
    """A node implicated in one incident of one job."""

    node: str
    kind: str
    restart: int | None = None


@dataclass
class JobAccount:
    """One ended job (or array task), as `stoker insights` sums it."""

    job_id: str
    name: str
    experiment: str
    user: str
    partition: str
    state: str
    cause: str | None
    """`stoker why`'s cause where the job did not complete."""
    submitted_at: float
    ended_at: float | None
    resource: str
    """"GPU" or "CPU": what the hours count."""
    per_rank: float
    """GPUs (or CPUs) one rank holds."""
    allocated_h: float
    productive_h: float
    lost_h: dict[str, float]
    """By cause (stoker.job_time.CAUSES), resource-hours."""
    queue_after_requeue_h: float
    """Wall hours between a start's end and the next start."""
    starts: int
    mfu: float | None
    samples_per_s: float | None
    nodes: list[NodeBlame] = field(default_factory=list)
    last_step: int | None = None
    """The last step any start logged."""
    accounted: bool = True
    """False for a job whose command kept no time account (a user's own command or loop,
    not the stoker runtime): its hours are allocated, their use unknown."""
    format: int = FORMAT

    @property
    def failed(self) -> bool:
        """Did it fail? A job someone cancelled did not: it is neither a failure nor
        its cause's, though its unsaved work is lost all the same."""
        return self.state not in NOT_FAILED_STATES

    @property
    def goodput(self) -> float | None:
        if not self.accounted or self.allocated_h <= 0:
            return None
        return self.productive_h / self.allocated_h

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def metrics(self) -> dict[str, float]:
        """As the runtime logs a job's time account at its end (stoker.job_time's
        `system/goodput/...`, in rank-hours), for a run the runtime could not log it to."""
        rank_h = 1 / self.per_rank if self.per_rank else 0.0
        return goodput_metrics(
            allocated_rank_h=self.allocated_h * rank_h,
            productive_rank_h=self.productive_h * rank_h,
            queue_after_requeue_s=self.queue_after_requeue_h * 3600,
            starts=float(self.starts),
            goodput=self.goodput,
            lost_rank_h={cause: hours * rank_h for cause, hours in self.lost_h.items()},
        )

    @classmethod
    def from_json(cls, data: Any) -> JobAccount | None:
        """The account kept in the ledger; None for one of another format or damaged."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        try:
            nodes = [NodeBlame(**n) for n in data.get("nodes", [])]
            account = cls(**{**data, "nodes": nodes})
        except TypeError:
            return None
        return account


def _read_config(run: Path) -> dict[str, Any]:
    """The frozen config's `job` and `tracking` sections (yaml only: no validation)."""
    import yaml

    # libyaml's loader where PyYAML has it: a status that sees 150 jobs end reads 150
    # configs, ~40 ms each in pure Python on a loaded login node, ~4 ms in C.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load((run / "config.yaml").read_text(), Loader=loader)
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def _per_rank(job: dict[str, Any]) -> tuple[str, float]:
    gpus = int(job.get("gpus_per_node") or 0)
    tasks = job.get("ntasks_per_node") or (gpus or 1)
    if gpus:
        return "GPU", gpus / int(tasks)
    return "CPU", float(job.get("cpus_per_task") or 1)


def _allocations(
    rows: Sequence[AcctRow], run: Path
) -> dict[int, tuple[float | None, float | None]]:
    """attempt -> SLURM's (Start, End) that bound it. sacct -D has one row per
    allocation (the first, and one per requeue); an allocation holds the attempt that
    began it and those started again in place after it: its Start bounds the first of
    them, its End the last."""
    started = [row for row in rows if row.started is not None]
    groups: list[list[int]] = []
    for k, fields in sorted(read_attempt_lines(run).items()):
        if fields.get("how") == "in-place" and groups:
            groups[-1].append(k)
        else:
            groups.append([k])
    if not groups:  # no attempts file: one attempt per allocation
        return {k: (row.started, row.ended) for k, row in enumerate(started)}
    bounds: dict[int, tuple[float | None, float | None]] = {}
    for row, group in zip(started, groups, strict=False):
        for k in group:
            first, last = k == group[0], k == group[-1]
            bounds[k] = (row.started if first else None, row.ended if last else None)
    return bounds


def failure_blames(run: Path) -> list[NodeBlame]:
    """The nodes the batch script left out when it restarted the job (`failures`)."""
    blames: list[NodeBlame] = []
    try:
        text = (run / "failures").read_text()
    except OSError:
        return blames
    for line in text.splitlines():
        head, _, kind = line.partition(" kind=")
        fields = dict(part.split("=", 1) for part in head.split()[1:] if "=" in part)
        node = fields.get("node", "-")
        if node in ("", "-"):
            continue
        restart = int(fields["restart"]) if fields.get("restart", "").isdigit() else None
        if kind.startswith("node "):
            blame = NODE_DOWN
        elif kind == "a hang":
            blame = HANG
        else:
            blame = KILLED_TASK
        blames.append(NodeBlame(node, blame, restart))
    return blames


def hang_blames(run: Path, restarts: Sequence[int]) -> list[NodeBlame]:
    """The host of the rank each start's watchdog found stalled (hang.json)."""
    import json

    blames = []
    for k in restarts:
        try:
            report = json.loads((run / HEARTBEAT_DIR / f"r{k}" / HANG_FILE).read_text())
            host = report.get("host") or report["ranks"][str(report["rank"])]["host"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(host, str) and host:
            blames.append(NodeBlame(host, HANG, k))
    return blames


def node_blames(
    run: Path, rows: Sequence[AcctRow], restarts: Sequence[int], stragglers: dict[str, int]
) -> list[NodeBlame]:
    """Every node implicated in this job, once per incident: a node the script left out
    (down, a hang, a killed task), a hang's host the script did not restart for (the
    job's last start), a NODE_FAIL attempt's only node, a host that straggled in
    STRAGGLER_WINDOWS or more log windows."""
    blames = failure_blames(run)
    seen = {(b.restart, b.kind) for b in blames}
    blames += [b for b in hang_blames(run, restarts) if (b.restart, HANG) not in seen]
    started = [row for row in rows if row.started is not None]
    for k, row in enumerate(started):
        if row.state == "NODE_FAIL" and row.node_list:
            hosts = expand_nodelist(row.node_list)
            if len(hosts) == 1:  # of several, SLURM does not say which one failed
                blames.append(NodeBlame(hosts[0], NODE_FAILURE, k))
    blames += [
        NodeBlame(host, STRAGGLER)
        for host, windows in sorted(stragglers.items())
        if windows >= STRAGGLER_WINDOWS
    ]
    return blames


def make_account(
    target: Target, state: str, rows: Sequence[AcctRow], cause: str | None
) -> JobAccount:
    """The account of `target`, ended in `state`, from its run folder and its sacct
    rows (every attempt; empty for a local job or where accounting is off)."""
    run = target.run.path
    config = _read_config(run)
    job = config.get("job") if isinstance(config.get("job"), dict) else {}
    tracking = config.get("tracking") if isinstance(config.get("tracking"), dict) else {}
    resource, per_rank = _per_rank(job or {})
    ended_at = max((row.ended for row in rows if row.ended is not None), default=None)
    failed = state != "COMPLETED"
    account = job_time(run, ended_at=ended_at, failed=failed, allocations=_allocations(rows, run))
    last = rows[-1] if rows else None
    to_h = per_rank / 3600
    lost = account.lost_rank_s()
    command = target.record.extra.get("command")
    accounted = any(s.start_step is not None for s in account.starts) or (
        isinstance(command, list) and runs_the_runtime([str(c) for c in command])
    )
    if not accounted:  # no account lines, and no runtime that would have written them
        lost = dict.fromkeys(CAUSES, 0.0)
    return JobAccount(
        job_id=target.job_id,
        name=target.record.name,
        experiment=str((tracking or {}).get("experiment") or "stoker"),
        user=(last.user if last and last.user else None) or _user(target.record.extra, run),
        partition=(last.partition if last and last.partition else None)
        or ("local" if target.record.backend == "local" else None)
        or str((job or {}).get("partition") or "?"),
        state=state,
        cause=cause if failed else None,
        submitted_at=target.record.submitted_at,
        ended_at=ended_at if ended_at is not None else _last_end(account.starts),
        resource=resource,
        per_rank=per_rank,
        allocated_h=account.allocated_rank_s * to_h,
        productive_h=account.productive_rank_s * to_h if accounted else 0.0,
        lost_h={c: lost[c] * to_h for c in CAUSES},
        queue_after_requeue_h=account.queue_after_requeue / 3600,
        starts=len(account.starts),
        mfu=_finite(account.mfu),
        samples_per_s=_finite(account.samples_per_s),
        nodes=node_blames(run, rows, [s.restart for s in account.starts], account.stragglers()),
        last_step=max(
            (s.last_step for s in account.starts if s.last_step is not None), default=None
        ),
        accounted=accounted,
    )


def _user(extra: dict[str, Any], run: Path) -> str:
    """Who submitted it: the ledger's record, else the run folder's owner."""
    if isinstance(extra.get("user"), str):
        return str(extra["user"])
    try:
        import pwd

        return pwd.getpwuid(run.stat().st_uid).pw_name
    except (OSError, KeyError):
        return "?"


def _last_end(starts: Sequence[Any]) -> float | None:
    return max((s.ended_at for s in starts), default=None)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
