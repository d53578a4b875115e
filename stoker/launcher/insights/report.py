"""`stoker insights`: the accounts of the jobs in the ledger (watch/job_account.py) summed.

Pure arithmetic over `JobAccount`s: `summarise` makes the report that the terminal
tables, `--json`, `--html` (html.py) and `--prometheus`
(prometheus.py) print. `collect` picks the jobs (a window of time, a user,
a partition) and settles those not yet seen ended, sacct asked in batches.
"""

from __future__ import annotations

import getpass
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoker.errors import StokerError
from stoker.job_time import CAUSES
from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.targets import targets_of
from stoker.launcher.watch.job_account import ACCOUNTS_KEY, JobAccount
from stoker.launcher.watch.job_end import Ended, keep_accounts

NODE_INCIDENTS = 2
"""A node implicated in this many incidents (over all the jobs) is reported."""
SACCT_BATCH = 500
"""Jobs per squeue/sacct call when settling: a command line of ids stays short."""
MFU_BINS = tuple(i / 10 for i in range(11))
"""MFU histogram edges: 0-10%, ..., 90-100%."""

_SINCE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str) -> float:
    """ "7d", "12h", "30m", "2w", "90s" -> seconds."""
    match = _SINCE.match(text.strip().lower())
    if not match:
        raise StokerError(
            f"--since {text!r} is not a duration",
            fix="give a number and a unit: 90s, 30m, 12h, 7d or 2w",
        )
    return float(match.group(1)) * _UNIT_S[match.group(2)]


@dataclass
class Totals:
    """Summed accounts of some jobs, in resource-hours of one resource."""

    jobs: int = 0
    allocated_h: float = 0.0
    productive_h: float = 0.0
    lost_h: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    queue_after_requeue_h: float = 0.0
    failed_jobs: int = 0
    failed_h: float = 0.0
    """Hours allocated to jobs that failed (neither completed nor cancelled)."""
    unaccounted_h: float = 0.0
    """Hours of jobs whose command kept no time account (JobAccount.accounted)."""

    def add(self, account: JobAccount) -> None:
        self.jobs += 1
        self.allocated_h += account.allocated_h
        if not account.accounted:
            self.unaccounted_h += account.allocated_h
        self.productive_h += account.productive_h
        for cause in CAUSES:
            self.lost_h[cause] += account.lost_h.get(cause, 0.0)
        self.queue_after_requeue_h += account.queue_after_requeue_h
        if account.failed:
            self.failed_jobs += 1
            self.failed_h += account.allocated_h

    @property
    def goodput(self) -> float | None:
        """Productive over allocated hours, of the jobs that kept an account."""
        accounted = self.allocated_h - self.unaccounted_h
        return self.productive_h / accounted if accounted > 1e-12 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "allocated_hours": self.allocated_h,
            "productive_hours": self.productive_h,
            "goodput": self.goodput,
            "lost_hours": dict(self.lost_h),
            "queue_after_requeue_hours": self.queue_after_requeue_h,
            "failed_jobs": self.failed_jobs,
            "failed_job_hours": self.failed_h,
            "unaccounted_hours": self.unaccounted_h,
        }


@dataclass
class NodeReport:
    """A node implicated in NODE_INCIDENTS or more incidents."""

    node: str
    incidents: int
    kinds: dict[str, int]
    jobs: list[str]

    def advice(self) -> tuple[str, str]:
        """(for users, for operators)."""
        return (
            f"add it to `exclude:` in the site profile (or job.exclude={self.node})",
            f"scontrol update NodeName={self.node} State=DRAIN "
            f'Reason="stoker insights: {self.incidents} incidents"',
        )

    def to_json(self) -> dict[str, Any]:
        users, operators = self.advice()
        return {
            "node": self.node,
            "incidents": self.incidents,
            "kinds": self.kinds,
            "jobs": self.jobs,
            "advice": {"users": users, "operators": operators},
        }


@dataclass
class Distribution:
    """Of finished jobs' MFU (or throughput): percentiles and a histogram."""

    count: int
    p10: float | None
    p50: float | None
    p90: float | None
    histogram: list[int]
    total: float = 0.0

    @classmethod
    def of(cls, values: Sequence[float], edges: Sequence[float] = MFU_BINS) -> Distribution:
        ordered = sorted(values)
        counts = [0] * (len(edges) - 1)
        for value in ordered:
            index = next((i for i in range(len(edges) - 1) if value < edges[i + 1]), len(edges) - 2)
            counts[index] += 1
        return cls(
            len(ordered),
            _percentile(ordered, 0.1),
            _percentile(ordered, 0.5),
            _percentile(ordered, 0.9),
            counts,
            sum(ordered),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "p10": self.p10,
            "p50": self.p50,
            "p90": self.p90,
            "histogram": self.histogram,
        }


def _percentile(ordered: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks (numpy's default)."""
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class Report:
    """What `stoker insights` shows."""

    since: float | None
    until: float
    filters: dict[str, str | None]
    totals: dict[str, Totals]  # by resource (GPU, CPU)
    by_user: dict[tuple[str, str], Totals]  # (user, resource)
    by_partition: dict[tuple[str, str], Totals]
    by_experiment: dict[tuple[str, str], Totals]
    failures: dict[str, int]  # cause -> jobs
    failure_hours: dict[str, float]  # cause -> hours allocated to them
    nodes: list[NodeReport]
    mfu: Distribution
    samples_per_s: Distribution
    daily: list[dict[str, Any]]  # {"day", "resource", "allocated_hours", ...}
    accounts: list[JobAccount]

    def to_json(self, *, per_job: bool = False) -> dict[str, Any]:
        """The report; `per_job` adds every job's account (`jobs`), else its count."""

        def groups(table: dict[tuple[str, str], Totals], name: str) -> list[dict[str, Any]]:
            return [
                {name: key, "resource": resource, **totals.to_json()}
                for (key, resource), totals in sorted(table.items())
            ]

        return {
            "since": self.since,
            "until": self.until,
            "filters": self.filters,
            "totals": {resource: t.to_json() for resource, t in sorted(self.totals.items())},
            "by_user": groups(self.by_user, "user"),
            "by_partition": groups(self.by_partition, "partition"),
            "by_experiment": groups(self.by_experiment, "experiment"),
            "failures": [
                {"cause": c, "jobs": n, "hours": self.failure_hours[c]}
                for c, n in sorted(self.failures.items(), key=lambda i: -i[1])
            ],
            "nodes": [n.to_json() for n in self.nodes],
            "mfu": self.mfu.to_json(),
            "samples_per_s": self.samples_per_s.to_json(),
            "daily": self.daily,
            "job_count": len(self.accounts),
            **({"jobs": [a.to_json() for a in self.accounts]} if per_job else {}),
        }


def summarise(
    accounts: Sequence[JobAccount],
    *,
    since: float | None = None,
    until: float | None = None,
    filters: dict[str, str | None] | None = None,
) -> Report:
    until = time.time() if until is None else until
    totals: dict[str, Totals] = defaultdict(Totals)
    # (who or where, resource) -> totals, one table per way of grouping the jobs.
    tables: dict[str, dict[tuple[str, str], Totals]] = {
        grouping: defaultdict(Totals) for grouping in ("user", "partition", "experiment")
    }
    failures: Counter[str] = Counter()
    failure_hours: dict[str, float] = defaultdict(float)
    incidents: dict[str, list[tuple[str, str]]] = defaultdict(list)  # node -> (job, kind)
    daily: dict[tuple[str, str], Totals] = defaultdict(Totals)
    mfu, throughput = [], []
    for account in accounts:
        resource = account.resource
        totals[resource].add(account)
        tables["user"][(account.user, resource)].add(account)
        tables["partition"][(account.partition, resource)].add(account)
        tables["experiment"][(account.experiment, resource)].add(account)
        if account.failed:
            cause = account.cause or account.state.lower()
            failures[cause] += 1
            failure_hours[cause] += account.allocated_h
        for blame in account.nodes:
            incidents[blame.node].append((account.job_id, blame.kind))
        if account.ended_at is not None:
            day = time.strftime("%Y-%m-%d", time.localtime(account.ended_at))
            daily[(day, resource)].add(account)
        if account.state == "COMPLETED":
            if account.mfu is not None:
                mfu.append(account.mfu)
            if account.samples_per_s is not None:
                throughput.append(account.samples_per_s)
    nodes = [
        NodeReport(
            node,
            len(found),
            dict(Counter(kind for _, kind in found)),
            sorted(dict.fromkeys(job for job, _ in found)),
        )
        for node, found in incidents.items()
        if len(found) >= NODE_INCIDENTS
    ]
    nodes.sort(key=lambda n: (-n.incidents, n.node))
    top = max(throughput, default=0.0)
    edges = [top * i / 10 for i in range(11)] if top else [0.0, 1.0]
    days = [
        {"day": day, "resource": resource, **t.to_json()}
        for (day, resource), t in sorted(daily.items())
    ]
    return Report(
        since=since,
        until=until,
        filters=filters or {},
        totals=dict(totals),
        by_user=dict(tables["user"]),
        by_partition=dict(tables["partition"]),
        by_experiment=dict(tables["experiment"]),
        failures=dict(failures),
        failure_hours=dict(failure_hours),
        nodes=nodes,
        mfu=Distribution.of(mfu),
        samples_per_s=Distribution.of(throughput, edges),
        daily=days,
        accounts=list(accounts),
    )


# ---------------------------------------------------------------- selection


def _in_window(record: JobRecord, since: float | None, now: float) -> bool:
    return since is None or record.submitted_at >= now - since


def select_records(
    ledger: Ledger,
    *,
    since: float | None,
    all_users: bool,
    now: float,
) -> list[JobRecord]:
    """The ledger's jobs submitted in the window; only this user's unless `all_users`
    (a ledger shared by a team: STOKER_HOME on a shared disk)."""
    me = getpass.getuser()
    records = []
    for record in ledger.list():
        if not record.run_dir or not _in_window(record, since, now):
            continue
        owner = record.extra.get("user")
        if not all_users and isinstance(owner, str) and owner != me:
            continue
        records.append(record)
    return records


def settle_unfinished(ledger: Ledger, records: Sequence[JobRecord], now: float) -> list[str]:
    """Ask SLURM about the jobs not yet seen ended (squeue and sacct, SACCT_BATCH jobs a
    call): those that ended are settled, their accounts made. Returns notes."""
    from stoker.launcher.watch.status import collect_status

    notes: list[str] = []
    waiting = [t for r in records if r.final_state is None for t in targets_of(r)]
    for start in range(0, len(waiting), SACCT_BATCH):
        batch = waiting[start : start + SACCT_BATCH]
        try:
            notes += collect_status(batch, ledger, now=now).notes
        except StokerError as exc:
            notes.append(f"could not ask SLURM about {len(batch)} job(s): {exc.message}")
            break
    return notes


def kept_accounts(records: Iterable[JobRecord]) -> tuple[list[JobAccount], list[Ended]]:
    """The accounts kept in these records (one per job or array task that ended), and
    the ended jobs (or tasks) that have none yet."""
    found: list[JobAccount] = []
    stale: list[Ended] = []
    for record in records:
        kept = record.extra.get(ACCOUNTS_KEY)
        kept = kept if isinstance(kept, dict) else {}
        for target in targets_of(record):
            account = JobAccount.from_json(kept.get(target.job_id))
            if account is not None:
                found.append(account)
            elif record.final_state:
                stale.append(Ended(target, record.final_state, judge=False))
    return found, stale


def collect(
    ledger: Ledger,
    *,
    since: float | None = None,
    all_users: bool = False,
    partition: str | None = None,
    now: float | None = None,
    settle: bool = True,
) -> tuple[Report, list[str]]:
    """The report over the ledger's jobs in the window, and notes on what could not be
    asked. Accounts missing for jobs seen ended before accounts were kept are made."""
    now = time.time() if now is None else now
    records = select_records(ledger, since=since, all_users=all_users, now=now)
    notes: list[str] = []
    if settle and any(r.final_state is None for r in records):
        notes = settle_unfinished(ledger, records, now)
        records = _reread(ledger, records)
    accounts, stale = kept_accounts(records)
    if stale:  # ended before this version kept accounts: made now, once
        keep_accounts(ledger, stale)
        accounts, _ = kept_accounts(_reread(ledger, records))
    if partition is not None:
        accounts = [a for a in accounts if a.partition == partition]
    filters = {"user": None if all_users else getpass.getuser(), "partition": partition}
    return summarise(accounts, since=since, until=now, filters=filters), notes


def _reread(ledger: Ledger, records: Sequence[JobRecord]) -> list[JobRecord]:
    ids = {r.job_id for r in records}
    return [r for r in ledger.list() if r.job_id in ids]
