"""What SLURM says about jobs, and the parsers of its answers: one batched `squeue` and
one batched `sacct` call for any number of jobs (`stoker status`, `logs`):

    squeue --jobs=1,2,3 -h -r -t all -O JobArrayID:|,State:|,...   live jobs (and jobs
        that ended less than MinJobAge ago, 300 s by default); one line per array task
    sacct -j 1,2,3 -X -n -P -D --format=JobID,State,...            the accounting
        database: every job that ever started or was cancelled, one line per
        allocation and, with -D, one per requeued attempt

Both are cheap for slurmctld/slurmdbd when batched (about 20 ms and 100 ms for
34 jobs here); the per-job loop that users write by hand is what overloads a
controller. `stoker why` looks closer at one job, with two more calls:

    scontrol show job -o ID                                        one line of
        Key=Value fields, while slurmctld still knows the job
    sacct -j ID -n -P --format=JobID,State,...,MaxRSS,ReqMem,...   the job and each
        of its steps (no -X), with memory and time limits

and `stoker doctor` reads the controller's settings (`scontrol show config`).

The parsers are pure functions of the text, tested on recorded outputs in
tests/launcher/test_slurm_query.py and tests/launcher/test_why.py.

Facts of SLURM 22.05 this module relies on (checked on the test cluster):
- `squeue --jobs=ID` with a single id that slurmctld no longer knows fails with
  "slurm_load_jobs error: Invalid job id specified"; with several ids it prints
  the known ones and exits 0. Either way those jobs are simply not in the queue.
- Without `-t all` squeue hides jobs that have ended, even within MinJobAge.
- squeue's `-O` fields take a suffix (`State:|`) and are then not padded or cut.
  Only `-O` has RestartCnt (the number of requeues); sacct has no restart field,
  but `-D` lists each requeued attempt as its own row.
- sacct writes "CANCELLED by <uid>"; a pending array appears as "123_[4-5]" (with
  "%N" when throttled); a held job may be absent from sacct until it is released
  or cancelled; NodeList is "None assigned" before the job starts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stoker.launcher.slurm.cli import SlurmError, run_slurm

# States of a job that has not started (again) yet, and of one that runs.
PENDING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"})
RUNNING_STATES = frozenset(
    {"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
)
# States after which a job never runs again on its own (requeue by hand aside).
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)

# squeue -O fields, each ended by the delimiter so no value is padded or cut.
_SQUEUE_FIELDS = (
    "JobArrayID",
    "State",
    "Reason",
    "NumNodes",
    "NodeList",
    "TimeUsed",
    "RestartCnt",
)
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in _SQUEUE_FIELDS)
_SACCT_FIELDS = (
    "JobID",
    "State",
    "ExitCode",
    "ElapsedRaw",
    "NNodes",
    "NodeList",
    "Reason",
    "Submit",
    "Start",
    "End",
    "Partition",
    "User",
)
SACCT_FORMAT = ",".join(_SACCT_FIELDS)
# sacct fields of one job and its steps (`stoker why`).
_STEP_FIELDS = (
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
STEP_FORMAT = ",".join(_STEP_FIELDS)

_ARRAY_ID = re.compile(r"^(\d+)_\[([0-9,\-]+)(?:%\d+)?\]$")
_ELAPSED = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$")
_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)$")
_MEM_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][\w:/]*)=")


@dataclass(frozen=True)
class QueueRow:
    """One job (or array task) as squeue shows it."""

    job_id: str  # "123" or "123_4"
    state: str
    reason: str | None  # why it is pending; None when squeue says "None"
    nodes: int | None  # allocated nodes, or requested ones while pending
    node_list: str | None
    elapsed_s: int | None
    restarts: int


@dataclass(frozen=True)
class AcctRow:
    """One allocation (one attempt of a requeued job) as sacct shows it."""

    job_id: str
    state: str
    exit_code: int | None  # the batch script's exit status
    signal: int | None  # the signal that ended it, if any
    elapsed_s: int | None
    nodes: int | None
    node_list: str | None
    reason: str | None
    submitted: float | None  # epoch seconds; a requeued attempt is submitted anew
    started: float | None = None  # epoch seconds; None while pending ("Unknown")
    ended: float | None = None
    partition: str | None = None
    user: str | None = None


@dataclass(frozen=True)
class StepRow:
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


@dataclass(frozen=True)
class ScontrolJob:
    """One job as `scontrol show job -o` shows it: what slurmctld knows now."""

    state: str | None  # None when the line has no JobState
    reason: str | None  # why it is pending, or how it ended
    exit_code: int | None
    signal: int | None
    elapsed_s: int | None  # RunTime
    time_limit_s: int | None
    end: float | None
    node_list: str | None
    restarts: int  # requeues
    min_mem: int | None  # bytes per node (MinMemoryNode)
    min_mem_text: str | None

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> ScontrolJob:
        """From `parse_scontrol_job`'s {key: value}."""
        reason = fields.get("Reason")
        code, signal = _exit_code(fields.get("ExitCode", ""))
        min_mem_text = fields.get("MinMemoryNode", "")
        min_mem = parse_mem(min_mem_text, default_unit="M")
        return cls(
            state=normalise_state(fields["JobState"]) if "JobState" in fields else None,
            reason=None if reason in (None, "None", "(null)") else reason,
            exit_code=code,
            signal=signal,
            elapsed_s=parse_elapsed(fields.get("RunTime", "")),
            time_limit_s=parse_elapsed(fields.get("TimeLimit", "")),
            end=_epoch(fields.get("EndTime", "")),
            node_list=_optional(fields.get("NodeList", ""), "(null)"),
            restarts=_int(fields.get("Restarts", "0")) or 0,
            min_mem=min_mem or None,
            min_mem_text=min_mem_text if min_mem else None,
        )


def normalise_state(raw: str) -> str:
    """SLURM's state name: "CANCELLED by 0" -> "CANCELLED", "running" -> "RUNNING"."""
    words = raw.strip().split()
    return words[0].rstrip("+").upper() if words else "UNKNOWN"


def parse_elapsed(text: str) -> int | None:
    """Seconds in SLURM's "[D-][H:]MM:SS" ("1-02:03:04", "5:07"); None for "INVALID" etc."""
    match = _ELAPSED.match(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def parse_mem(text: str, default_unit: str = "") -> int | None:
    """SLURM memory ("426132K", "100M", "1.5G", "4000Mn") in bytes; None if blank."""
    match = _MEM.match(text.strip())
    if not match:
        return None
    number, unit, _per = match.groups()
    return int(float(number) * _MEM_UNITS[unit or default_unit])


def format_elapsed(seconds: float) -> str:
    """The inverse of parse_elapsed, as squeue prints it: "5:07", "1:02:03", "1-02:03:04"."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{secs:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{secs:02d}"
    return f"{minutes}:{secs:02d}"


def _expand_ranges(spec: str) -> list[int]:
    """The indices of a range list: "1,3-5" -> [1, 3, 4, 5]."""
    indices: list[int] = []
    for part in spec.split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices


def expand_job_id(job_id: str) -> list[str]:
    """Ids one squeue/sacct line stands for: "123_[4-5%2]" -> ["123_4", "123_5"]."""
    match = _ARRAY_ID.match(job_id)
    if not match:
        return [job_id]
    base, spec = match.groups()
    return [f"{base}_{index}" for index in _expand_ranges(spec)]


def count_hosts(node_list: str) -> int:
    """Hosts in a SLURM host list: "n[1-2],gpu[01-04,07],login" -> 8."""
    count = 0
    for group in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", node_list):
        bracket = group.find("[")
        count += len(_expand_ranges(group[bracket + 1 : -1])) if bracket >= 0 else 1
    return count


def _optional(value: str, *empty: str) -> str | None:
    value = value.strip()
    return None if not value or value in empty else value


def _int(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def parse_squeue(text: str) -> dict[str, QueueRow]:
    """Rows of `squeue -h -O SQUEUE_FORMAT`, by job id ("123", "123_4").

    A still unsplit pending array ("123_[4-5]", squeue without -r) gives one row per task.
    """
    rows: dict[str, QueueRow] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(_SQUEUE_FIELDS):
            continue  # a blank or foreign line (squeue prints nothing else with -h)
        job_id, state, reason, nodes, node_list, elapsed, restarts = fields[: len(_SQUEUE_FIELDS)]
        for one_id in expand_job_id(job_id.strip()):
            rows[one_id] = QueueRow(
                job_id=one_id,
                state=normalise_state(state),
                reason=_optional(reason, "None", "(null)"),
                nodes=_int(nodes),
                node_list=_optional(node_list, "(null)"),
                elapsed_s=parse_elapsed(elapsed),
                restarts=_int(restarts) or 0,
            )
    return rows


def _exit_code(value: str) -> tuple[int | None, int | None]:
    """sacct's "3:0" -> (3, None); "0:9" -> (0, 9)."""
    code, _, signal = value.partition(":")
    signal_number = _int(signal)
    return _int(code), signal_number or None


def _epoch(value: str) -> float | None:
    """sacct's local time "2026-11-21T06:02:13" as epoch seconds; None for "Unknown"."""
    try:
        return time.mktime(time.strptime(value.strip(), "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def parse_sacct(text: str) -> dict[str, list[AcctRow]]:
    """Rows of `sacct -X -n -P -D --format=SACCT_FORMAT`, by job id, oldest attempt first."""
    rows: dict[str, list[AcctRow]] = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != len(_SACCT_FIELDS):
            continue
        job_id, state, exit_code, elapsed, nodes, node_list, reason, submitted = fields[:8]
        started, ended, partition, user = fields[8:]
        code, signal = _exit_code(exit_code)
        for one_id in expand_job_id(job_id.strip()):
            rows.setdefault(one_id, []).append(
                AcctRow(
                    job_id=one_id,
                    state=normalise_state(state),
                    exit_code=code,
                    signal=signal,
                    elapsed_s=_int(elapsed),
                    nodes=_int(nodes),
                    node_list=_optional(node_list, "None assigned", "(null)"),
                    reason=_optional(reason, "None"),
                    submitted=_epoch(submitted),
                    started=_epoch(started),
                    ended=_epoch(ended),
                    partition=_optional(partition),
                    user=_optional(user),
                )
            )
    for attempts in rows.values():
        # sacct lists attempts in database order; sort by submission to be sure (stable).
        attempts.sort(key=lambda row: row.submitted or 0.0)
    return rows


def parse_sacct_steps(text: str) -> list[StepRow]:
    """Rows of `sacct -n -P --format=STEP_FORMAT`: the job's row and its steps' rows."""
    rows: list[StepRow] = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < len(_STEP_FIELDS):
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
            node_list,
            end,
            ntasks,
            nnodes,
        ) = fields[: len(_STEP_FIELDS)]
        code, signal = _exit_code(exit_code)
        by = re.search(r"CANCELLED by (\d+)", state)
        rows.append(
            StepRow(
                step_id=job_id.strip(),
                state=normalise_state(state),
                cancelled_by=int(by.group(1)) if by else None,
                exit_code=code,
                signal=signal,
                max_rss=parse_mem(max_rss),
                req_mem=parse_mem(req_mem, default_unit="M"),
                req_mem_text=_optional(req_mem),
                time_limit_s=parse_elapsed(limit),
                elapsed_s=parse_elapsed(elapsed),
                node_list=_optional(node_list, "None assigned"),
                end=_epoch(end),
                ntasks=_int(ntasks),
                nnodes=_int(nnodes),
            )
        )
    return rows


def parse_scontrol_job(text: str) -> dict[str, str]:
    """`scontrol show job -o ID` as {key: value}; values may contain spaces."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    matches = list(_SCONTROL_KEY.finditer(line))
    fields: dict[str, str] = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields[match.group(1)] = line[match.end() : end].strip()
    return fields


def parse_show_config(text: str) -> dict[str, str]:
    """`Key = value` lines of `scontrol show config`; other lines are skipped."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        match = re.match(r"^(\S+)\s*=\s?(.*)$", line)
        if match:
            config[match.group(1)] = match.group(2).strip()
    return config


def _id_list(job_ids: Iterable[str]) -> str:
    return ",".join(dict.fromkeys(job_ids))


def query_queue(job_ids: Sequence[str]) -> dict[str, QueueRow]:
    """One squeue call for all `job_ids` (array ids give all their tasks).

    Jobs slurmctld has forgotten are simply absent. Raises SlurmError when squeue
    is missing or fails for another reason.
    """
    if not job_ids:
        return {}
    argv = ["squeue", f"--jobs={_id_list(job_ids)}", "-h", "-r", "-t", "all", "-O", SQUEUE_FORMAT]
    try:
        text = run_slurm(argv, timeout=30)
    except SlurmError as exc:
        if "Invalid job id" in exc.stderr:
            return {}  # only ids that ended more than MinJobAge ago
        raise
    return parse_squeue(text)


def query_accounting(job_ids: Sequence[str]) -> dict[str, list[AcctRow]]:
    """One sacct call for all `job_ids`, requeued attempts included.

    Raises SlurmError when sacct is missing or accounting is off or unreachable.
    """
    if not job_ids:
        return {}
    argv = [
        "sacct",
        "-j",
        _id_list(job_ids),
        "-X",
        "-n",
        "-P",
        "-D",
        f"--format={SACCT_FORMAT}",
    ]
    return parse_sacct(run_slurm(argv, timeout=30))


def query_job(job_id: str) -> ScontrolJob | None:
    """One `scontrol show job` call; None when slurmctld no longer knows the job.

    Raises SlurmError when scontrol is missing or fails for another reason.
    """
    try:
        text = run_slurm(["scontrol", "show", "job", "-o", job_id], timeout=30)
    except SlurmError as exc:
        if "Invalid job id" in exc.stderr:
            return None
        raise
    fields = parse_scontrol_job(text)
    return ScontrolJob.from_fields(fields) if fields else None


def query_steps(job_id: str) -> list[StepRow]:
    """One sacct call: the rows of `job_id` and of its steps (not -X), no other job's.

    Raises SlurmError when sacct is missing or accounting is off or unreachable.
    """
    text = run_slurm(["sacct", "-j", job_id, "-n", "-P", f"--format={STEP_FORMAT}"], timeout=30)
    return [
        row
        for row in parse_sacct_steps(text)
        if row.step_id == job_id or row.step_id.startswith(job_id + ".")
    ]
