"""`stoker why`: why a job ended the way it did (or why it has not started).

Facts are gathered once (`gather_facts`), then judged by a pure function
(`judge`), so every rule can be tested on recorded text:

    scontrol show job -o ID      one call, while slurmctld still knows the job
    sacct -j ID -n -P ...        one call, the job and its steps (not -X): State,
                                 ExitCode, MaxRSS, ReqMem, Timelimit, Elapsed, End
    logs/batch.log               srun's "task N: Exited with exit code X" lines (the
                                 first is the first failure: --kill-on-bad-exit kills
                                 the others after it), slurmstepd's "*** ... DUE TO
                                 TIME LIMIT ***" and memory-limit messages
    logs/r<R>/rank-<T>.log       of the last restart: the failing rank's traceback,
                                 signatures (SIGNATURES below), and each file's mtime
                                 (a rank silent long before the end has hung)
    events                       the batch script's stop, requeue and restart decisions
    local-state.json             instead of SLURM for `--local` jobs

Host memory on clusters that do not enforce --mem. Where SLURM runs without
cgroups and without memory accounting (TaskPlugin=task/none,
JobAcctGatherType=jobacct_gather/none, as the test cluster), a task that uses
more than --mem is not stopped by SLURM and sacct has no MaxRSS: it runs until
the kernel's OOM killer ends it with SIGKILL, which srun reports as
"task N: Killed". A first failing task killed by SIGKILL, with no time limit,
cancel or other signature to explain it, is therefore reported as host memory.
Where SLURM does enforce it, its own messages are recognised: state
OUT_OF_MEMORY and "Detected N oom-kill event(s)" (task/cgroup), and
"StepId=X exceeded memory limit (A > B), being killed" (JobAcctGatherParams=
OverMemoryKill), with sacct's MaxRSS against ReqMem.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stoker.launcher.logs import split_batch_by_restart
from stoker.protocol import HANG_FILE, HEARTBEAT_DIR, STACK_HEADER
from stoker.launcher.rundir import RunDir
from stoker.launcher.slurm_query import normalise_state, parse_elapsed
from stoker.launcher.status import Target, read_local_state

# How much of each log is read: tracebacks and signatures are at the end.
FAILING_RANK_TAIL_BYTES = 256 * 1024
OTHER_RANK_TAIL_BYTES = 64 * 1024
MAX_RANKS_SCANNED = 512
TRACEBACK_MAX_LINES = 30
# A rank is "hung" when it printed nothing for this long before the end:
# max(HUNG_MIN_S, HUNG_FRACTION of the elapsed time, capped at HUNG_CAP_S).
HUNG_MIN_S = 30.0
HUNG_FRACTION = 0.25
HUNG_CAP_S = 1800.0
# MaxRSS of one task times tasks per node at or above this share of ReqMem is "near".
MEM_NEAR = 0.9

SACCT_FIELDS = (
    "JobID",
    "State",
    "ExitCode",
    "DerivedExitCode",
    "MaxRSS",
    "ReqMem",
    "Timelimit",
    "Elapsed",
    "NodeList",
    "End",
    "NTasks",
    "NNodes",
)

PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})
RUNNING_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
)


# ---------------------------------------------------------------- signatures


@dataclass(frozen=True)
class Signature:
    """A line in a log that names a cause. First match in table order wins."""

    cause: str
    pattern: re.Pattern[str]
    summary: str
    fix: str


def _sig(cause: str, regex: str, summary: str, fix: str) -> Signature:
    return Signature(cause, re.compile(regex), summary, fix)


_HOST_MEM_FIX = (
    "ask for more host memory (--mem / job.mem, e.g. twice the peak; --mem 0 takes a "
    "whole node's), or use less: fewer data loader workers (data.num_workers), a smaller "
    "data.batch_size"
)

# (regex, cause, fix): extend here. Ordered: a specific cause before a generic one.
SIGNATURES: tuple[Signature, ...] = (
    _sig(
        "host-oom",
        r"exceeded memory limit|Exceeded (?:job|step) memory limit|Detected \d+ oom[-_ ]kill"
        r"|oom[-_]kill event|Out of memory: Killed process|Memory cgroup out of memory",
        "host out of memory: killed for exceeding its memory",
        _HOST_MEM_FIX,
    ),
    _sig(
        "gpu-oom",
        r"CUDA out of memory|torch\.(?:cuda\.)?OutOfMemoryError|CUDA error: out of memory"
        r"|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED",
        "GPU out of memory",
        "use less GPU memory per rank: a smaller data.batch_size (raise train.grad_accum to "
        "keep the global batch), train.activation_checkpointing=selective or full, or more "
        "GPUs to shard over (job.nodes); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "helps when the message shows much reserved but unallocated memory",
    ),
    _sig(
        "nccl-timeout",
        r"Watchdog caught collective operation timeout|ProcessGroupNCCL.*[Tt]imed? ?out"
        r"|NCCL.*timed out|collective operation timeout",
        "NCCL collective timed out: some rank stopped taking part",
        "find the rank that stopped first (it hung or failed: `stoker logs JOB --tail 30`); "
        "a slow rank points at its node (`stoker logs JOB --rank N`), a hang at a deadlock "
        "or stuck I/O. Raise the timeout only if one step legitimately takes that long",
    ),
    _sig(
        "nccl",
        r"ProcessGroupNCCL|NCCL error|ncclInternalError|ncclSystemError"
        r"|ncclUnhandledCudaError|ncclRemoteError|ncclInvalidUsage|DistBackendError",
        "NCCL communication error",
        "rerun with job.env.NCCL_DEBUG=INFO to see which transport and peer failed; check "
        "the nodes' network (IB/RoCE, NCCL_SOCKET_IFNAME) with `stoker doctor`; a "
        "'remote process exited' error means another rank failed first: read its log",
    ),
    _sig(
        "port-in-use",
        r"Address already in use|EADDRINUSE",
        "the rendezvous port is already in use on the first node",
        "MASTER_PORT is taken by another process on the first node (another job, or a "
        "leftover process): resubmit; set job.env.MASTER_PORT to a free port if it persists",
    ),
    _sig(
        "rendezvous",
        r"RendezvousTimeoutError|RendezvousConnectionError|RendezvousClosedError"
        r"|DistNetworkError|DistStoreError|TCPStore|[Cc]onnection refused"
        r"|Connection reset by peer|Name or service not known|No route to host"
        r"|Socket Timeout|connect\(\) timed out",
        "ranks could not meet at the rendezvous (MASTER_ADDR:MASTER_PORT)",
        "check that every node reaches MASTER_ADDR (the first node's NodeAddr in `scontrol "
        "show node`) on MASTER_PORT (no firewall, the name resolves on the nodes), and that "
        "rank 0 started: if it failed first, its log has the real error",
    ),
    _sig(
        "host-oom",
        r"^\s*MemoryError\b|std::bad_alloc|Cannot allocate memory",
        "host out of memory: an allocation failed",
        _HOST_MEM_FIX,
    ),
    _sig(
        "gpu-error",
        r"CUDA error: (?:an illegal memory access|unspecified launch failure|device-side assert)"
        r"|Xid \d+|uncorrectable ECC error",
        "CUDA error on a GPU",
        "a device-side assert or illegal access is a bug (rerun with CUDA_LAUNCH_BLOCKING=1); "
        "ECC or Xid errors are the GPU's: resubmit and report the node",
    ),
)


@dataclass(frozen=True)
class SignatureHit:
    signature: Signature
    line: str
    source: str  # "rank 3" or "batch.log"


def find_signature(text: str, source: str) -> SignatureHit | None:
    """The first signature (in table order) that matches a line of `text`."""
    lines = text.splitlines()
    for signature in SIGNATURES:
        for line in lines:
            if signature.pattern.search(line):
                return SignatureHit(signature, line.strip(), source)
    return None


# ---------------------------------------------------------------- srun's lines

# srun prints strsignal(): these are Linux's names.
_SIGNAL_NAMES = {
    "Hangup": 1,
    "Interrupt": 2,
    "Quit": 3,
    "Illegal instruction": 4,
    "Trace/breakpoint trap": 5,
    "Aborted": 6,
    "Bus error": 7,
    "Floating point exception": 8,
    "Killed": 9,
    "User defined signal 1": 10,
    "Segmentation fault": 11,
    "User defined signal 2": 12,
    "Broken pipe": 13,
    "Alarm clock": 14,
    "Terminated": 15,
}
_TASK_LINE = re.compile(
    r"^(?:srun|local): error: (?:(?P<node>[^:\s]+): )?tasks? (?P<ranks>[\d,\-]+): (?P<what>.+)$"
)
_EXITED = re.compile(r"^Exited with exit code (-?\d+)")


@dataclass(frozen=True)
class TaskFailure:
    """One of srun's "task N: ..." lines (or the local supervisor's, worded the same)."""

    node: str | None
    ranks: tuple[int, ...]
    exit_code: int | None  # "Exited with exit code X"
    signal: int | None  # killed by this signal
    line: str

    @property
    def status(self) -> int | None:
        """As a shell shows it: the exit code, or 128 + the signal."""
        if self.signal is not None:
            return 128 + self.signal
        return self.exit_code

    def how(self) -> str:
        if self.signal is not None:
            return f"was killed by signal {self.signal} ({_signal_name(self.signal)})"
        return f"exited with code {self.exit_code}"


def _signal_name(number: int) -> str:
    import signal as signal_module

    try:
        return signal_module.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _ranks(spec: str) -> tuple[int, ...]:
    ranks: list[int] = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        if low.isdigit():
            ranks.extend(range(int(low), int(high or low) + 1))
    return tuple(ranks)


def parse_task_failures(text: str) -> list[TaskFailure]:
    """srun's (and the local supervisor's) task failure lines, in the order printed."""
    failures: list[TaskFailure] = []
    for raw in text.splitlines():
        line = raw.strip()
        match = _TASK_LINE.match(line)
        if not match:
            continue
        what = match.group("what").strip()
        exited = _EXITED.match(what)
        code: int | None = None
        signal: int | None = None
        if exited:
            code = int(exited.group(1))
            if code < 0:  # the local supervisor prints Popen's -N for a signal
                signal, code = -code, None
        else:
            name = what.removesuffix(" (core dumped)").strip()
            signal = _SIGNAL_NAMES.get(name)
            if signal is None:
                continue  # a message srun words otherwise; not a task's end
        failures.append(
            TaskFailure(match.group("node"), _ranks(match.group("ranks")), code, signal, line)
        )
    return failures


def first_failure(failures: Sequence[TaskFailure]) -> TaskFailure | None:
    """The first task that ended badly. srun reports the task that failed first, then
    those --kill-on-bad-exit terminated; a SIGTERM'd task is never first when another
    line reports a real failure."""
    for failure in failures:
        if failure.signal != 15:
            return failure
    return failures[0] if failures else None


# ---------------------------------------------------------------- tracebacks

_TB_START = "Traceback (most recent call last):"
# Prefixes torch.distributed and launchers put before each line of a rank's output.
_LINE_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]:\s?|^\d+: ")


def _strip_prefix(line: str) -> str:
    return _LINE_PREFIX.sub("", line, count=1)


def last_traceback(text: str, max_lines: int = TRACEBACK_MAX_LINES) -> list[str] | None:
    """The last Python traceback in `text`, through its exception line; middle frames
    are elided to keep at most `max_lines` lines. None if there is none."""
    lines = [_strip_prefix(line.rstrip("\r")) for line in text.splitlines()]
    starts = [i for i, line in enumerate(lines) if line.strip() == _TB_START]
    if not starts:
        return None
    block = lines[starts[-1] :]
    end = len(block)
    for i, line in enumerate(block[1:], start=1):
        if line and not line[0].isspace():
            end = i + 1  # the exception line
            break
    block = block[:end]
    if len(block) > max_lines:
        keep_tail = max_lines - 2
        elided = len(block) - 1 - keep_tail
        block = [block[0], f"  ... ({elided} lines)", *block[-keep_tail:]]
    return block


def exception_line(traceback: Sequence[str]) -> str | None:
    """The `Type: message` line that ends a traceback, if it has one."""
    if len(traceback) < 2:
        return None
    last = traceback[-1]
    if last and not last[0].isspace() and last.strip() != _TB_START:
        return last.strip()
    return None


# ---------------------------------------------------------------- sacct, scontrol

_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_mem(text: str, default_unit: str = "") -> int | None:
    """SLURM memory ("426132K", "100M", "1.5G", "4000Mn") in bytes; None if blank."""
    match = _MEM.match(text.strip())
    if not match:
        return None
    number, unit, _per = match.groups()
    return int(float(number) * _UNITS[unit or default_unit])


def format_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def _epoch(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class SacctRow:
    """The job or one of its steps ("123", "123.batch", "123.0"), as sacct shows it."""

    step_id: str
    state: str
    cancelled_by: int | None  # uid from "CANCELLED by 0"
    exit_code: int | None
    signal: int | None
    max_rss: int | None  # bytes, the largest task of the step
    req_mem: int | None  # bytes, per node
    req_mem_text: str | None
    time_limit_s: int | None
    elapsed_s: int | None
    node_list: str | None
    end: float | None
    ntasks: int | None
    nnodes: int | None

    @property
    def is_job(self) -> bool:
        return "." not in self.step_id


def parse_sacct_rows(text: str) -> list[SacctRow]:
    """`sacct -n -P --format=<SACCT_FIELDS>` lines, job row and step rows."""
    rows: list[SacctRow] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(SACCT_FIELDS):
            continue
        (
            job_id,
            state,
            exit_code,
            _derived,
            max_rss,
            req_mem,
            limit,
            elapsed,
            nodes,
            end,
            ntasks,
            nnodes,
        ) = fields[: len(SACCT_FIELDS)]
        code, _, signal = exit_code.partition(":")
        by = re.search(r"CANCELLED by (\d+)", state)
        rows.append(
            SacctRow(
                step_id=job_id.strip(),
                state=normalise_state(state),
                cancelled_by=int(by.group(1)) if by else None,
                exit_code=_int_or_none(code),
                signal=(_int_or_none(signal) or None),
                max_rss=parse_mem(max_rss),
                req_mem=parse_mem(req_mem, default_unit="M"),
                req_mem_text=req_mem.strip() or None,
                time_limit_s=parse_elapsed(limit),
                elapsed_s=parse_elapsed(elapsed),
                node_list=nodes.strip() if nodes.strip() not in ("", "None assigned") else None,
                end=_epoch(end),
                ntasks=_int_or_none(ntasks),
                nnodes=_int_or_none(nnodes),
            )
        )
    return rows


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


def parse_scontrol_job(text: str) -> dict[str, str]:
    """`scontrol show job -o ID` as {key: value}; values may contain spaces."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    matches = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


# ---------------------------------------------------------------- pending reasons

PENDING_REASONS: tuple[tuple[str, str, str], ...] = (
    # (reason prefix, what it means, what to do)
    (
        "Resources",
        "waiting for enough idle nodes/GPUs/CPUs for its request",
        "wait; a smaller request (fewer nodes or GPUs) or a shorter --time lets the "
        "backfill scheduler start it sooner; `squeue --start -j JOB` shows SLURM's estimate",
    ),
    (
        "Priority",
        "jobs with a higher priority are ahead of it in the queue",
        "wait; `sprio -j JOB` shows its priority factors",
    ),
    (
        "QOSMaxJobsPerUserLimit",
        "you already run the most jobs your QOS allows",
        "wait for one of your jobs to end, or use another QOS (--qos)",
    ),
    (
        "QOSMax",
        "a limit of the job's QOS is reached",
        "wait, or ask for less or use another QOS (`sacctmgr show qos` lists the limits)",
    ),
    (
        "QOSGrp",
        "the QOS's group limit (jobs, CPUs, GPUs of all its users) is reached",
        "wait, or use another QOS",
    ),
    (
        "AssocGrp",
        "the account's group limit (CPUs, GPUs, jobs) is reached",
        "wait, or use another account (--account)",
    ),
    (
        "AssocMax",
        "a per-job or per-user limit of the account is reached",
        "ask for less, or use another account",
    ),
    (
        "ReqNodeNotAvail",
        "a node it needs is down, drained or reserved",
        "wait, or drop the node or feature requirement (job.constraint); `sinfo -R` says why "
        "nodes are unavailable",
    ),
    (
        "DependencyNeverSatisfied",
        "a job it depends on (--after) failed: it can never start",
        "cancel it (`stoker cancel JOB`) and submit again without --after",
    ),
    (
        "Dependency",
        "waiting for the job(s) it depends on (--after) to finish",
        "nothing to do; `scontrol show job JOB | grep Dependency` shows them",
    ),
    (
        "BeginTime",
        "its start time is in the future; SLURM holds a requeued job about two "
        "minutes before it may start again",
        "`scontrol update JobId=JOB StartTime=now` lets it start at once",
    ),
    (
        "JobHeldUser",
        "held by its owner (`stoker requeue --hold`, `scontrol hold`)",
        "`scontrol release JOB`",
    ),
    ("JobHeldAdmin", "held by an administrator", "ask the cluster's administrators"),
    (
        "launch failed requeued held",
        "the job failed to launch on its nodes and was held",
        "`scontrol release JOB`; if it fails again, run `stoker doctor` and report the nodes",
    ),
    (
        "PartitionTimeLimit",
        "its --time is above the partition's MaxTime: it will never start",
        "lower job.time to the partition's limit (`stoker doctor` lists partitions)",
    ),
    (
        "PartitionNodeLimit",
        "it asks for more nodes than the partition allows",
        "ask for fewer nodes, or use another partition",
    ),
    ("PartitionDown", "the partition is down", "wait, or use another partition"),
    ("PartitionInactive", "the partition is inactive", "use another partition"),
    ("Reservation", "waiting for its reservation to start", "wait for the reservation"),
    (
        "BadConstraints",
        "no node can satisfy its constraints",
        "fix job.constraint or the resource request",
    ),
    ("InvalidAccount", "its account is not valid", "set job.account to an account you may use"),
    ("InvalidQOS", "its QOS is not valid", "set job.qos to a QOS you may use"),
    ("None", "just submitted: the scheduler has not looked at it yet", "wait a few seconds"),
)


def explain_pending(reason: str | None) -> tuple[str, str]:
    """(meaning, fix) of squeue's pending reason."""
    text = (reason or "None").strip()
    for prefix, meaning, fix in PENDING_REASONS:
        if text.startswith(prefix):
            return meaning, fix
    return (
        f"SLURM's reason code {text}",
        "see JOB REASON CODES in `man squeue`, or ask the cluster's administrators",
    )


# ---------------------------------------------------------------- facts


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
    steps: list[SacctRow] = field(default_factory=list)
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
    notes: list[str] = field(default_factory=list)  # what could not be asked


@dataclass
class Diagnosis:
    """What `stoker why` prints. `cause` is one of: completed, running, pending,
    exception, exit-code, batch-script, time-limit, hung, requeues-exhausted,
    stop-signal, host-oom, gpu-oom, gpu-error, nccl, nccl-timeout, rendezvous,
    port-in-use, cancelled, preempted, node-failure, deadline, unknown."""

    job_id: str
    state: str
    cause: str
    summary: str
    evidence: list[str]
    fix: str | None
    failing_rank: int | None = None
    exit_code: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "state": self.state,
            "cause": self.cause,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "fix": self.fix,
            "failing_rank": self.failing_rank,
            "exit_code": self.exit_code,
        }


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
    if local.state == "RUNNING" and local.supervisor_pid is not None:
        try:
            os.kill(local.supervisor_pid, 0)
        except ProcessLookupError:
            facts.supervisor_died = True
            facts.state = "FAILED"
        except PermissionError:
            pass


def _slurm_facts(facts: JobFacts, target: Target) -> None:
    from stoker.launcher.slurm_cli import SlurmError, run_slurm

    job_id = target.job_id
    live: dict[str, str] = {}
    try:
        live = parse_scontrol_job(run_slurm(["scontrol", "show", "job", "-o", job_id], timeout=30))
    except SlurmError as exc:
        if "Invalid job id" not in exc.stderr:
            facts.notes.append(f"scontrol: {exc.message.splitlines()[0]}")
    try:
        text = run_slurm(
            ["sacct", "-j", job_id, "-n", "-P", f"--format={','.join(SACCT_FIELDS)}"],
            timeout=30,
        )
        rows = [r for r in parse_sacct_rows(text) if _belongs(r.step_id, job_id)]
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
    if live:
        facts.state = normalise_state(live.get("JobState", facts.state))
        reason = live.get("Reason")
        facts.reason = None if reason in (None, "None", "(null)") else reason
        code, _, sig = live.get("ExitCode", "").partition(":")
        if facts.exit_code is None:
            facts.exit_code = _int_or_none(code)
            facts.exit_signal = _int_or_none(sig) or None
        facts.elapsed_s = parse_elapsed(live.get("RunTime", "")) or facts.elapsed_s
        facts.time_limit_s = parse_elapsed(live.get("TimeLimit", "")) or facts.time_limit_s
        end = _epoch(live.get("EndTime", ""))
        if facts.state not in RUNNING_STATES | PENDING_STATES and end is not None:
            facts.end_time = facts.end_time or end
        node_list = live.get("NodeList")
        if node_list and node_list != "(null)":
            facts.node_list = node_list
        facts.restarts = _int_or_none(live.get("Restarts", "0")) or 0
        min_mem = live.get("MinMemoryNode", "")
        if facts.req_mem is None and parse_mem(min_mem, default_unit="M"):
            facts.req_mem, facts.req_mem_text = parse_mem(min_mem, default_unit="M"), min_mem
    if acct is None and not live:
        if target.record.final_state:
            facts.state = target.record.final_state
            facts.notes.append("SLURM no longer knows the job; state from the ledger")
        else:
            facts.notes.append("SLURM knows nothing of the job (accounting off or purged)")


def _belongs(step_id: str, job_id: str) -> bool:
    return step_id == job_id or step_id.startswith(job_id + ".")


# ---------------------------------------------------------------- judging


def judge(facts: JobFacts) -> Diagnosis:
    """The diagnosis from gathered facts: a pure function, rules in the module docstring."""
    state = facts.state
    make = _Maker(facts)
    if state in PENDING_STATES:
        return _pending(facts, make)
    if state in RUNNING_STATES:
        return _running(facts, make)
    if state == "COMPLETED" and not parse_task_failures(facts.batch_log):
        return make("completed", "completed successfully (exit 0)", [], None, exit_code=0)
    if facts.hang is not None:
        return _hung_by_watchdog(facts, make, facts.hang)
    if facts.supervisor_died:
        return make(
            "node-failure",
            "the local supervisor died (killed, or the machine rebooted) while the job ran",
            [],
            "submit again; the ranks may still run: check with `ps`",
        )
    timed_out = state == "TIMEOUT" or _find(facts.batch_log, r"DUE TO TIME LIMIT")
    if timed_out:
        return _time_limit(facts, make)
    if state == "CANCELLED":
        return _cancelled(facts, make)
    if state == "OUT_OF_MEMORY":
        return _host_memory(facts, make, killed=None, signature=None)
    if state == "NODE_FAIL":
        nodes = facts.node_list or "its nodes"
        return make(
            "node-failure",
            f"a node of the job failed ({nodes}): SLURM lost contact with it",
            [f"sacct: State NODE_FAIL, NodeList {nodes}"],
            "submit again (or `stoker requeue JOB`): the job resumes from its last "
            "checkpoint; if the same node fails again, report it (`sinfo -R` shows why "
            "nodes are down)",
        )
    if state == "PREEMPTED":
        return make(
            "preempted",
            "preempted by a higher-priority job and not requeued",
            _event_lines(facts, "stop requested|requeue"),
            "`stoker requeue JOB` (or submit again) to continue from the last checkpoint; "
            "a job that saves on the stop signal is requeued by itself (job.max_requeues)",
        )
    if state == "BOOT_FAIL":
        return make(
            "node-failure",
            "its nodes failed to boot",
            [],
            "submit again; report the nodes if it repeats",
        )
    if state == "DEADLINE":
        return make(
            "deadline",
            "it reached its --deadline before it could finish",
            [],
            "submit again with a later deadline",
        )
    if state == "UNKNOWN" and not parse_task_failures(facts.batch_log):
        return make(
            "unknown",
            "SLURM no longer knows the job and its logs name no failure",
            [f"batch.log: {line}" for line in facts.batch_log.splitlines()[-3:]],
            "`stoker logs JOB --tail 20` shows how each rank ended",
        )
    return _failed(facts, make)


# What to look at first, by the phase the stalled rank was in.
_HANG_FIXES = {
    "data": "the rank waited for data: check the data source and its storage "
    "(`stoker data inspect URL`), and data.num_workers",
    "sync": "the collective never completed on every rank: a network or NCCL fault; "
    "run the job again, and report the node if it repeats",
    "save": "the checkpoint write stalled: check checkpoint.root's storage",
}
_HANG_FIX_OTHER = (
    "read the stalled rank's stack below: a deadlock in the code, or a device that "
    "stopped answering (run `nvidia-smi` on the node); raise train.hang_timeout_s if "
    "that phase can take longer"
)


_DUMP_LINE = re.compile(r"^(Thread 0x|Current thread 0x|  File |  <no Python frame>|  \.\.\.|$)")


def _stack_of(text: str, rank: int) -> list[str]:
    """The Python stacks that follow the watchdog's header line for `rank` in its log
    (faulthandler's format: one block per thread), the watchdog's own thread (the
    "Current thread", which did the dump) left out."""
    lines = [_strip_prefix(line) for line in text.splitlines()]
    start = None
    for index, line in enumerate(lines):
        if line.startswith(f"{STACK_HEADER} {rank} "):
            start = index
    if start is None:
        return []
    blocks: list[list[str]] = []
    for line in lines[start + 1 :]:
        if not _DUMP_LINE.match(line):
            break
        if line.startswith(("Thread 0x", "Current thread 0x")):
            blocks.append([line])
        elif line.strip() and blocks:
            blocks[-1].append(line)
    kept = [line for block in blocks if not block[0].startswith("Current") for line in block]
    return kept[: TRACEBACK_MAX_LINES * 2]


def _hung_by_watchdog(facts: JobFacts, make: _Maker, hang: dict[str, Any]) -> Diagnosis:
    rank = hang.get("rank")
    rank = rank if isinstance(rank, int) else None
    phase = str(hang.get("phase", "?"))
    evidence = [f"heartbeat/r{facts.restart}/{HANG_FILE}: {hang['message']}"]
    others = hang.get("ranks") or {}
    if isinstance(others, dict) and others:
        phases: dict[str, list[str]] = {}
        for other, beat in sorted(others.items(), key=lambda kv: int(kv[0])):
            if isinstance(beat, dict):
                phases.setdefault(str(beat.get("phase")), []).append(str(other))
        evidence.append(
            "ranks by phase: " + "; ".join(f"{p}: {', '.join(r)}" for p, r in phases.items())
        )
    if rank is not None:
        stack = _stack_of(facts.rank_logs.get(rank, ""), rank)
        if stack:
            evidence.append(f"rank {rank}'s stack (logs/r{facts.restart}/rank-{rank}.log):")
            evidence.extend(f"  {line}" for line in stack)
    fix = (
        "the rank's process was killed or froze: look for the OOM killer in the node's "
        "kernel log (dmesg); run the job again, excluding the node if it repeats"
        if hang.get("gone")
        else _HANG_FIXES.get(phase, _HANG_FIX_OTHER)
    )
    return make("hung", f"the hang watchdog failed the job: {hang['message']}", evidence,
                fix, failing_rank=rank)  # fmt: skip


class _Maker:
    def __init__(self, facts: JobFacts) -> None:
        self.facts = facts

    def __call__(
        self,
        cause: str,
        summary: str,
        evidence: list[str],
        fix: str | None,
        *,
        failing_rank: int | None = None,
        exit_code: int | None = None,
        job_exit: bool = True,
    ) -> Diagnosis:
        facts = self.facts
        ended = facts.state not in RUNNING_STATES | PENDING_STATES
        if exit_code is None and job_exit and ended:
            exit_code = 128 + facts.exit_signal if facts.exit_signal else facts.exit_code
        # The batch script's restarts after failures, whatever the diagnosis: a job that
        # completed after losing a node, or one left failed with no restart left.
        restarts = _event_lines(facts, "restart(ing|ed) after failure", all_restarts=True)
        evidence = [*evidence, *(e for e in restarts if e not in evidence)]
        evidence += [f"note: {n}" for n in facts.notes]
        fix_text = fix.replace("JOB", facts.job_id) if fix else None
        if fix_text and _event_lines(facts, "not restarted after failure"):
            fix_text += "; raise job.max_restarts to have such failures restarted by the job"
        return Diagnosis(
            facts.job_id, facts.state, cause, summary, evidence, fix_text, failing_rank, exit_code
        )


def _find(text: str, regex: str) -> str | None:
    for line in text.splitlines():
        if re.search(regex, line):
            return line.strip()
    return None


def _event_lines(facts: JobFacts, regex: str, *, all_restarts: bool = False) -> list[str]:
    """`events` lines matching `regex`, of the restart judged unless `all_restarts`."""
    since = None if all_restarts else facts.restart_started
    lines = []
    for line in facts.events:
        stamp = line.partition(" ")[0]
        if since is not None and stamp.isdigit() and float(stamp) < since:
            continue
        if re.search(regex, line):
            lines.append(f"events: {_event_text(line)}")
    return lines


def _event_text(line: str) -> str:
    stamp, _, text = line.partition(" ")
    if stamp.isdigit():
        return f"{time.strftime('%H:%M:%S', time.localtime(int(stamp)))} {text}"
    return line


def _pending(facts: JobFacts, make: _Maker) -> Diagnosis:
    meaning, fix = explain_pending(facts.reason)
    reason = facts.reason or "None"
    summary = f"pending ({reason}): {meaning}"
    evidence = [f"scontrol: JobState={facts.state} Reason={reason}"]
    if facts.restarts:
        evidence.append(f"requeued {facts.restarts} time(s) so far")
    evidence += _event_lines(facts, "requeue", all_restarts=True)[-2:]
    return make("pending", summary, evidence, fix)


def silent_ranks(facts: JobFacts) -> tuple[list[int], float]:
    """Ranks that printed nothing for the hung threshold before the end (or now), and
    the longest such silence. A log ending in slurmstepd's own message was touched at
    the end by slurmstepd, not the rank: it is left out."""
    end = facts.end_time or time.time()
    elapsed = float(facts.elapsed_s or 0)
    threshold = max(HUNG_MIN_S, min(HUNG_FRACTION * elapsed, HUNG_CAP_S))
    silent: list[int] = []
    longest = 0.0
    for rank, mtime in sorted(facts.rank_mtimes.items()):
        tail = facts.rank_logs.get(rank, "").rstrip().splitlines()
        if tail and tail[-1].startswith("slurmstepd"):
            continue
        quiet = end - mtime
        if quiet >= threshold:
            silent.append(rank)
            longest = max(longest, quiet)
    return silent, longest


def _rank_list(ranks: Sequence[int]) -> str:
    from stoker.launcher.logs import _ranges

    return _ranges(sorted(ranks))


def _running(facts: JobFacts, make: _Maker) -> Diagnosis:
    from stoker.launcher.slurm_query import format_elapsed

    elapsed = f" for {format_elapsed(facts.elapsed_s)}" if facts.elapsed_s is not None else ""
    where = f" on {facts.node_list}" if facts.node_list else ""
    start = "first start" if not facts.restart else f"restart {facts.restart}"
    if facts.restart_started is not None:
        start += f", began {time.strftime('%H:%M:%S', time.localtime(facts.restart_started))}"
    evidence = [start]
    if facts.rank_mtimes:
        quiet = time.time() - max(facts.rank_mtimes.values())
        evidence.append(f"last output from any rank {max(0.0, quiet):.0f} s ago")
    silent, longest = silent_ranks(facts)
    if silent and len(silent) < len(facts.rank_mtimes):
        evidence.append(
            f"rank(s) {_rank_list(silent)} printed nothing for {longest:.0f} s while others did"
        )
        return make(
            "running",
            f"running{elapsed}{where}; rank(s) {_rank_list(silent)} may be hung",
            evidence,
            "see what the silent rank is doing: `py-spy dump --pid PID` on its node, or "
            "`stoker logs JOB -f --rank N`",
        )
    return make(
        "running",
        f"running{elapsed}{where}",
        evidence,
        "nothing wrong so far; `stoker logs JOB -f` follows it",
    )


def _time_limit(facts: JobFacts, make: _Maker) -> Diagnosis:
    from stoker.launcher.slurm_query import format_elapsed

    limit = format_elapsed(facts.time_limit_s) if facts.time_limit_s is not None else "?"
    elapsed = format_elapsed(facts.elapsed_s) if facts.elapsed_s is not None else "?"
    evidence = [f"time limit {limit}, elapsed {elapsed}"]
    line = _find(facts.batch_log, r"DUE TO TIME LIMIT")
    if line:
        evidence.append(f"batch.log: {line}")
    events = _event_lines(facts, "stop requested|requeue")
    evidence += events
    silent, longest = silent_ranks(facts)
    if silent:
        talking = sorted(set(facts.rank_mtimes) - set(silent))
        for rank in silent:
            last = facts.rank_logs.get(rank, "").rstrip().splitlines()[-1:]
            evidence.append(f"rank {rank} last printed: {last[0].strip() if last else '(nothing)'}")
        if talking:
            evidence.append(f"rank(s) {_rank_list(talking)} kept printing until the end")
        return make(
            "hung",
            f"hung: no output from rank(s) {_rank_list(silent)} for {longest:.0f} s before "
            f"the time limit ({limit})",
            evidence,
            "the job hung rather than ran out of time, so more time will not help: read the "
            "silent rank's last lines (`stoker logs JOB --rank N --tail 30`). A rank stuck in "
            "a collective waits for a peer (a deadlock, or a rank that skipped a step); one "
            "stuck in I/O waits for storage. Rerun and `py-spy dump` it while it hangs",
            failing_rank=silent[0],
            job_exit=False,
        )
    fix = (
        "give it more time (job.time / --time), or let it continue: a job that saves and "
        "exits 75 when asked to stop is requeued and resumes (job.max_requeues)"
    )
    if any("stop requested: SIGUSR2" in e for e in events):
        evidence.append(
            "the tasks were asked to stop (SIGUSR2, STOKER_STOP_FILE) before the limit but "
            "did not exit in time"
        )
        fix += (
            "; the tasks did not react to the stop request: save and exit with code 75 when "
            "STOKER_STOP_FILE appears (the stoker runtime does), or raise job.stop_grace"
        )
    return make(
        "time-limit",
        f"reached its time limit ({limit}) after {elapsed}",
        evidence,
        fix,
        job_exit=False,
    )


def _cancelled(facts: JobFacts, make: _Maker) -> Diagnosis:
    who = "someone"
    evidence: list[str] = []
    if facts.cancelled_by is not None:
        try:
            name = pwd.getpwuid(facts.cancelled_by).pw_name
        except KeyError:
            name = "user"
        who = f"{name} (uid {facts.cancelled_by})"
        evidence.append(f"sacct: State CANCELLED by {facts.cancelled_by}")
    line = _find(facts.batch_log, r"\*\*\* JOB .* CANCELLED AT")
    if line:
        evidence.append(f"batch.log: {line}")
    evidence += _event_lines(facts, "stop requested|not requeued")
    if facts.backend == "local":
        who = "`stoker cancel` (SIGTERM to the local supervisor)"
        local = _find(facts.batch_log, r"cancelled")
        if local:
            evidence.append(f"batch.log: {local}")
    if not facts.rank_logs:
        evidence.append("no rank logs: it was cancelled before it started")
    return make(
        "cancelled",
        f"cancelled by {who}",
        evidence,
        "nothing failed; `stoker requeue JOB` (while SLURM still knows the job) or a new "
        "submission continues from the last checkpoint",
        job_exit=False,
    )


_LIMIT_NUMBERS = re.compile(r"\((\d+) > (\d+)\)")


def _mem_evidence(facts: JobFacts) -> list[str]:
    """Requested against peak memory, as far as sacct knows them."""
    peak = max(
        (s for s in facts.steps if s.max_rss is not None),
        key=lambda s: s.max_rss or 0,
        default=None,
    )
    if peak is None or peak.max_rss is None:
        if facts.backend == "local":
            return []
        return [
            "sacct has no MaxRSS: memory accounting is off on this cluster, so the peak "
            "is unknown and SLURM does not enforce --mem"
        ]
    per_node = max(1, -(-(peak.ntasks or 1) // (peak.nnodes or 1)))
    line = f"sacct: peak RSS of one task {format_bytes(peak.max_rss)} (step {peak.step_id})"
    if facts.req_mem:
        line += f", requested {facts.req_mem_text} per node"
        if peak.max_rss * per_node >= MEM_NEAR * facts.req_mem:
            line += f" ({per_node} task(s) per node: at or over the request)"
    return [line]


def _memory_kill(facts: JobFacts) -> SignatureHit | None:
    """SLURM's or the kernel's word that memory ran out, from any log of this restart;
    a line with the numbers ("(A > B)") is preferred."""
    hits = []
    sources = [("batch.log", facts.batch_log)]
    sources += [(f"rank {r}", text) for r, text in sorted(facts.rank_logs.items())]
    for source, text in sources:
        hit = find_signature(text, source)
        if hit is not None and hit.signature.cause == "host-oom":
            hits.append(hit)
    with_numbers = [h for h in hits if _LIMIT_NUMBERS.search(h.line)]
    chosen = with_numbers or hits
    return chosen[0] if chosen else None


def _host_memory(
    facts: JobFacts,
    make: _Maker,
    *,
    killed: TaskFailure | None,
    signature: SignatureHit | None,
) -> Diagnosis:
    evidence = _mem_evidence(facts)
    request = f"--mem {facts.req_mem_text} per node" if facts.req_mem_text else "no --mem"
    if killed is not None:
        evidence.insert(0, f"batch.log: {killed.line}")
    if signature is not None:
        evidence.insert(0, f"{signature.source}: {signature.line}")
    rank = killed.ranks[0] if killed and killed.ranks else None
    if killed is None:
        who = "the job"
    elif len(killed.ranks) == 1:
        who = f"rank {killed.ranks[0]}"
    else:
        who = f"ranks {_rank_list(killed.ranks)}"
    numbers = _LIMIT_NUMBERS.search(signature.line) if signature else None
    if numbers:
        used, allowed = (int(n) for n in numbers.groups())
        summary = (
            f"host out of memory: the tasks used {format_bytes(used)}, over the "
            f"{format_bytes(allowed)} allowed ({request}); SLURM killed {who}"
        )
    elif facts.state == "OUT_OF_MEMORY" or signature is not None:
        summary = f"host out of memory: {who} used more memory than allowed ({request})"
    else:
        summary = (
            f"host out of memory (most likely): {who} was killed by SIGKILL with no other "
            f"cause found, as the kernel's OOM killer does ({request})"
        )
    return make(
        "host-oom",
        summary,
        evidence,
        _HOST_MEM_FIX,
        failing_rank=rank,
        exit_code=killed.status if killed else None,
    )


def _stop_signal(facts: JobFacts, make: _Maker, first: TaskFailure) -> Diagnosis:
    """Tasks killed by SIGUSR2, the signal that asks them to save and stop."""
    from stoker.launcher.slurm_query import format_elapsed

    evidence = [f"batch.log: {first.line}", *_event_lines(facts, "stop requested")]
    grace, limit = facts.stop_grace_s, facts.time_limit_s
    fix = (
        "handle SIGUSR2 in the command: save and exit with code 75 (the stoker runtime "
        "does), or ignore it; an unhandled SIGUSR2 kills a process"
    )
    if grace is not None and limit is not None and grace >= limit:
        evidence.append(
            f"job.stop_grace is {grace} s but the time limit is {format_elapsed(limit)}: "
            "the stop signal was sent as soon as the job started"
        )
        fix += f"; and set job.stop_grace well below job.time (now {grace} s >= the limit)"
    return make(
        "stop-signal",
        f"rank(s) {_rank_list(first.ranks)} were killed by the stop signal SIGUSR2, which "
        "they do not handle",
        evidence,
        fix,
        failing_rank=first.ranks[0] if first.ranks else None,
        exit_code=first.status,
    )


def _failed(facts: JobFacts, make: _Maker) -> Diagnosis:
    exhausted = _event_lines(facts, r"not requeued after .*restarts used")
    if exhausted:
        return make(
            "requeues-exhausted",
            "stopped at its time limit (or preemption) with no requeues left: "
            + exhausted[-1].split(" ", 2)[-1],
            _event_lines(facts, "stop requested|requeue", all_restarts=True)[-6:],
            "raise job.max_requeues, or job.time so that fewer restarts are needed; "
            "`stoker requeue JOB` continues it now from the last checkpoint",
        )
    first = first_failure(parse_task_failures(facts.batch_log))
    if first is None and facts.local_ranks:
        bad = [r for r, code in sorted(facts.local_ranks.items()) if code not in (0, None)]
        if bad:
            code = facts.local_ranks[bad[0]] or 0
            first = TaskFailure(
                None,
                (bad[0],),
                code if code > 0 else None,
                -code if code < 0 else None,
                f"local-state.json: rank {bad[0]} exit {code}",
            )
    rank = first.ranks[0] if first and first.ranks else None

    memory = _memory_kill(facts)
    if memory is not None:
        return _host_memory(facts, make, killed=first, signature=memory)
    if first is not None and first.signal == 12:
        return _stop_signal(facts, make, first)

    evidence = [f"batch.log: {first.line}"] if first else []
    traceback: list[str] | None = None
    hit: SignatureHit | None = None
    if rank is not None:
        text = facts.rank_logs.get(rank, "")
        traceback = last_traceback(text)
        hit = find_signature(text, f"rank {rank}")
    tb_evidence: list[str] = []
    if traceback:
        tb_evidence = [
            f"rank {rank} traceback (logs/r{facts.restart}/rank-{rank}.log):",
            *(f"  {line}" for line in traceback),
        ]
    exc = exception_line(traceback) if traceback else None
    status = first.status if first else None

    if hit is not None:
        return make(
            hit.signature.cause,
            f"{hit.signature.summary} (rank {rank})",
            [*evidence, f"{hit.source}: {hit.line}", *tb_evidence],
            hit.signature.fix,
            failing_rank=rank,
            exit_code=status,
        )
    if first is not None and first.signal == 9:
        return _host_memory(facts, make, killed=first, signature=None)
    if exc is not None:
        return make(
            "exception",
            f"rank {rank} failed first: {exc}",
            [*evidence, *tb_evidence],
            f"fix the error in rank {rank}'s traceback; the other ranks were stopped "
            "because it failed (srun --kill-on-bad-exit)",
            failing_rank=rank,
            exit_code=status,
        )
    for other_rank, text in sorted(facts.rank_logs.items()):
        other = find_signature(text, f"rank {other_rank}")
        if other is not None:
            first_note = f"; rank {rank} failed first" if rank is not None else ""
            return make(
                other.signature.cause,
                f"{other.signature.summary} (seen in rank {other_rank}{first_note})",
                [*evidence, f"{other.source}: {other.line}"],
                other.signature.fix,
                failing_rank=rank,
                exit_code=status,
            )
    if first is not None:
        last_lines = (
            facts.rank_logs.get(rank, "").rstrip().splitlines()[-5:] if rank is not None else []
        )
        return make(
            "exit-code",
            f"rank {rank} {first.how()} (no traceback in its log)",
            [*evidence, *(f"rank {rank}: {line}" for line in last_lines)],
            f"read the rank's last lines (`stoker logs JOB --rank {rank} --tail 50`): "
            + _exit_code_hint(first),
            failing_rank=rank,
            exit_code=status,
        )
    # No task failed: the batch script itself (setup lines, the code folder, srun).
    last_batch = [line for line in facts.batch_log.splitlines() if line.strip()][-5:]
    return make(
        "batch-script",
        f"the batch script failed (exit {facts.exit_code}) outside the ranks",
        [*(f"batch.log: {line}" for line in last_batch), *_event_lines(facts, ".")[-3:]],
        "read logs/batch.log: a job.setup line, the code folder or srun itself failed; "
        "`stoker submit --dry-run` prints the script",
    )


def _exit_code_hint(failure: TaskFailure) -> str:
    if failure.signal == 11:
        return "a segmentation fault is a crash in native code (a CUDA/C++ extension)"
    if failure.signal == 6:
        return "SIGABRT: a C++ exception or assertion (c10::Error, an NCCL abort)"
    if failure.exit_code == 127:
        return "exit 127: the command was not found in the job's environment"
    if failure.exit_code == 126:
        return "exit 126: the command is not executable"
    return "the process exited without a Python traceback"


# ---------------------------------------------------------------- entry point


def diagnose(target: Target) -> Diagnosis:
    """Gather the facts of one job (or array task) and judge them."""
    return judge(gather_facts(target))
