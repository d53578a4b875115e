"""A job's time account: where the time of the ranks it was given went, from its run
folder's records (no SLURM call). A leaf module (json and paths only): the runtime logs
it at a job's end, the launcher for a job that ended without doing so.

    attempts                      when each attempt began, how (the first start, after a
                                  requeue, in place), on which nodes and spares
    accounting/r<k>.jsonl         rank 0's account of start k (runtime/observe/time_account.py)
    heartbeat/r<k>/hang.json      the watchdog's report, where start k hung

Per start k, from its attempt line to its end (its account's `end` line; for a start
killed before it wrote one, its last line or the next start's attempt), every rank's
seconds fall into one of:

    startup        the first attempt to its first step: Python, imports, rendezvous,
                   model, resume, the loader's first batch
    restart_in_place  the same, for an attempt started again inside the allocation
    restart_requeue   the same, for an attempt after a requeue (preemption, time limit,
                   a failure the allocation could not host)
    productive     steps that were kept, less their data wait
    data_wait      waiting for the loader, in kept steps
    checkpoint     the loop held by checkpoint saves
    sampling       drawing samples (train.sample_every)
    redone         steps a later start ran again: those after the checkpoint it resumed from
    hang           from the stalled rank's last progress to the watchdog's detection
    after_last_step  from the last logged step to the start's end, less any hang: the
                   final save and exit, or a failure and its teardown
    other          what none of the above explains (log steps, evaluation)

and between starts the job waited in the queue (`queue_after_requeue`, wall seconds:
no rank was allocated then). Rank-seconds are the start's seconds times its ranks.
Spare nodes (job.spare_nodes) are charged in full: their seconds, in ranks as many as a
training node runs, are allocated and lost to `spare_nodes`.
goodput = productive / allocated.

Steps past the last committed checkpoint of a job's last start that failed are
`redone`-like waste too: pass `kept_through` (the step its work is kept through) and
they count as `after_last_step`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.metric_names import goodput_metrics
from stoker.protocol import ACCOUNTING_DIR, HANG_FILE, HEARTBEAT_DIR, expand_nodelist

CAUSES = (
    "startup",
    "restart_in_place",
    "restart_requeue",
    "spare_nodes",
    "data_wait",
    "checkpoint",
    "sampling",
    "redone",
    "hang",
    "after_last_step",
    "other",
)
"""The lost-time causes, in report order (productive time is not one)."""


@dataclass
class StartTime:
    """One start's seconds (per rank; `ranks` many ranks ran them)."""

    restart: int
    began_at: float
    ended_at: float
    ranks: int
    how: str = "start"
    """How the attempt began: start, requeue or in-place (the batch script's word)."""
    spare_ranks: float = 0.0
    """The spare nodes it held, in ranks (as many per node as a training node runs)."""
    start_step: int | None = None
    last_step: int | None = None
    status: str | None = None
    """The trainer's own word (FINISHED, REQUEUE, KILLED, FAILED); None: it wrote none."""
    productive: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))
    mfu: list[float] = field(default_factory=list)
    """Each log window's MFU (where the device's peak is known)."""
    samples_per_s: list[float] = field(default_factory=list)
    """Each log window's throughput, per rank."""
    stragglers: dict[str, int] = field(default_factory=dict)
    """host -> log windows whose slowest rank ran there, over STRAGGLER_RATIO times the
    median rank."""

    @property
    def allocated(self) -> float:
        return max(self.ended_at - self.began_at, 0.0)


@dataclass
class JobTime:
    starts: list[StartTime]
    queue_after_requeue: float
    """Wall seconds between a start's end and the next start's beginning, summed."""

    @property
    def allocated_rank_s(self) -> float:
        return sum(s.allocated * (s.ranks + s.spare_ranks) for s in self.starts)

    @property
    def productive_rank_s(self) -> float:
        return sum(s.productive * s.ranks for s in self.starts)

    @property
    def goodput(self) -> float | None:
        allocated = self.allocated_rank_s
        return self.productive_rank_s / allocated if allocated > 0 else None

    def lost_rank_s(self) -> dict[str, float]:
        return {c: sum(s.lost[c] * s.ranks for s in self.starts) for c in CAUSES}

    @property
    def mfu(self) -> float | None:
        """The median log window's MFU over every start (None: never known)."""
        return _median([v for s in self.starts for v in s.mfu])

    @property
    def samples_per_s(self) -> float | None:
        """The median log window's throughput per rank over every start."""
        return _median([v for s in self.starts for v in s.samples_per_s])

    def stragglers(self) -> dict[str, int]:
        """host -> log windows (of every start) it held the straggler."""
        found: dict[str, int] = {}
        for start in self.starts:
            for host, count in start.stragglers.items():
                found[host] = found.get(host, 0) + count
        return found

    def metrics(self) -> dict[str, float]:
        """The account as MLflow metrics (`system/goodput/...`, on the run's System metrics
        tab: rank-hours and seconds)."""
        return goodput_metrics(
            allocated_rank_h=self.allocated_rank_s / 3600,
            productive_rank_h=self.productive_rank_s / 3600,
            queue_after_requeue_s=self.queue_after_requeue,
            starts=float(len(self.starts)),
            goodput=self.goodput,
            lost_rank_h={cause: s / 3600 for cause, s in self.lost_rank_s().items()},
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocated_rank_hours": self.allocated_rank_s / 3600,
            "productive_rank_hours": self.productive_rank_s / 3600,
            "goodput": self.goodput,
            "lost_rank_hours": {c: v / 3600 for c, v in self.lost_rank_s().items()},
            "queue_after_requeue_s": self.queue_after_requeue,
            "mfu": self.mfu,
            "samples_per_s": self.samples_per_s,
            "stragglers": self.stragglers(),
            "starts": [asdict(s) for s in self.starts],
        }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def read_lines(path: Path) -> list[dict[str, Any]]:
    """A start's account; a line that does not parse (cut short by a kill) and the
    lines after it are left out."""
    lines: list[dict[str, Any]] = []
    try:
        text = path.read_text()
    except OSError:
        return lines
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            break
        if isinstance(line, dict) and isinstance(line.get("kind"), str):
            lines.append(line)
    return lines


def read_attempts(run_dir: Path) -> dict[int, float]:
    """restart -> when that attempt began (its first line wins)."""
    return {k: float(fields["at"]) for k, fields in read_attempt_lines(run_dir).items()}


def read_attempt_lines(run_dir: Path) -> dict[int, dict[str, str]]:
    """restart -> the fields of its line in `attempts` (`at`: the epoch it began; `how`:
    start, requeue or in-place, for lines written before `how=` by their place)."""
    found: dict[int, dict[str, str]] = {}
    try:
        text = (run_dir / "attempts").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        parts = line.split()
        fields = dict(p.split("=", 1) for p in parts[1:] if "=" in p)
        try:
            k = int(fields["restart"])
            fields["at"] = str(float(parts[0]))
        except (KeyError, ValueError, IndexError):
            continue
        fields.setdefault("how", "start" if k == 0 else "requeue")
        found.setdefault(k, fields)
    return found


def _spare_ranks(fields: Mapping[str, str], ranks: int) -> float:
    """The spares an attempt held, in ranks: as many per node as its training nodes ran."""
    spares = expand_nodelist(fields.get("spares", ""))
    nodes = expand_nodelist(fields.get("nodes", ""))
    if not spares or not nodes:
        return 0.0
    return len(spares) * ranks / len(nodes)


def _hang_s(run_dir: Path, restart: int) -> float:
    path = run_dir / HEARTBEAT_DIR / f"r{restart}" / HANG_FILE
    try:
        report = json.loads(path.read_text())
        return max(float(report["stalled_s"]), 0.0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0.0


def job_time(
    run_dir: Path,
    *,
    ended_at: float | None = None,
    kept_through: int | None = None,
    failed: bool = False,
    allocations: Mapping[int, tuple[float | None, float | None]] | None = None,
) -> JobTime:
    """The time account of the job whose run folder is `run_dir`. `ended_at`: when the
    job ended (SLURM's End), for a last start that wrote no end line; `kept_through`:
    the last step whose work the job kept, where its last start failed (the newest
    committed checkpoint); None keeps every step of the last start, unless `failed`:
    then its work is kept through the newest checkpoint the job's accounts saw commit
    (else the step the start resumed from). `allocations`:
    restart -> SLURM's (Start, End) of that attempt (sacct -D), which bound each start
    where known: its prolog counts as start-up, its teardown after the last line as
    after_last_step."""
    run_dir = Path(run_dir)
    lines_of = read_attempt_lines(run_dir)
    attempts = {k: float(fields["at"]) for k, fields in lines_of.items()}
    slurm = dict(allocations or {})
    accounts = {k: read_lines(run_dir / ACCOUNTING_DIR / f"r{k}.jsonl") for k in sorted(attempts)}
    restarts = sorted(attempts)
    if failed and kept_through is None and restarts:
        commits = [
            int(line["step"])
            for lines in accounts.values()
            for line in lines
            if line["kind"] == "commit"
        ]
        kept_through = max(commits, default=_start_step(accounts[restarts[-1]]) or 0)
    starts: list[StartTime] = []
    for index, k in enumerate(restarts):
        lines = accounts[k]
        nxt = restarts[index + 1] if index + 1 < len(restarts) else None
        # The next start resumed from this step: what this start did after it is redone.
        resumed = _start_step(accounts[nxt]) if nxt is not None else None
        keep = resumed if nxt is not None else kept_through
        slurm_start, slurm_end = slurm.get(k, (None, None))
        end_line = next((line for line in lines if line["kind"] == "end"), None)
        if nxt is not None and lines_of[nxt].get("how") == "in-place":
            # The allocation was held until the next attempt began: detection and
            # teardown are this attempt's loss.
            ended = attempts[nxt]
        elif slurm_end is not None:
            ended = slurm_end
        elif end_line is not None:
            ended = float(end_line["at"])
        elif nxt is None and ended_at is not None:
            ended = ended_at
        elif lines:
            ended = max(float(line["at"]) for line in lines)
        else:
            ended = attempts[nxt] if nxt is not None else (ended_at or attempts[k])
        began = min(slurm_start, attempts[k]) if slurm_start is not None else attempts[k]
        start = _start(k, began, max(ended, began), lines, keep, _hang_s(run_dir, k))
        _charge_attempt(start, lines_of[k])
        if nxt is None:  # nothing ran them again: the last start's lost steps are its tail
            start.lost["after_last_step"] += start.lost["redone"]
            start.lost["redone"] = 0.0
        starts.append(start)
    queue = sum(
        max(starts[i + 1].began_at - starts[i].ended_at, 0.0)
        for i in range(len(starts) - 1)
        if starts[i + 1].how != "in-place"
    )
    return JobTime(starts, queue)


def _charge_attempt(start: StartTime, fields: Mapping[str, str]) -> None:
    """An attempt's start-up after a restart is that restart's cost; its spares are
    charged in full."""
    start.how = fields.get("how", "start")
    cause = {"in-place": "restart_in_place", "requeue": "restart_requeue"}.get(start.how)
    if cause is not None:
        start.lost[cause] += start.lost["startup"]
        start.lost["startup"] = 0.0
    start.spare_ranks = _spare_ranks(fields, start.ranks)
    if start.ranks:
        start.lost["spare_nodes"] = start.allocated * start.spare_ranks / start.ranks


def _start_step(lines: list[dict[str, Any]]) -> int | None:
    first = next((line for line in lines if line["kind"] == "start"), None)
    return int(first["start_step"]) if first is not None else None


def _start(
    restart: int,
    began: float,
    ended: float,
    lines: list[dict[str, Any]],
    keep: int | None,
    hang: float,
) -> StartTime:
    head = next((line for line in lines if line["kind"] == "start"), {})
    first = next((line for line in lines if line["kind"] == "first_step"), None)
    end = next((line for line in lines if line["kind"] == "end"), None)
    windows = [line for line in lines if line["kind"] == "window"]
    start = StartTime(
        restart=restart,
        began_at=began,
        ended_at=ended,
        ranks=int(head.get("ranks", 1)),
        start_step=head.get("start_step"),
        last_step=int(windows[-1]["step"]) if windows else None,
        status=end.get("status") if end is not None else None,
    )
    lost = start.lost
    if first is None:  # never reached a step: all of it went to start-up
        lost["startup"] = start.allocated
        return start
    lost["startup"] = max(float(first["at"]) - began, 0.0)
    for window in windows:
        steps = max(int(window["steps"]), 1)
        wall = float(window["step_s"])
        overhead = float(window["checkpoint_s"]) + float(window["sample_s"])
        lost["checkpoint"] += float(window["checkpoint_s"])
        lost["sampling"] += float(window["sample_s"])
        in_steps = max(wall - overhead, 0.0)
        data = min(float(window["data_s"]), in_steps)
        # The share of the window's steps kept: steps (step - steps, step].
        last = int(window["step"])
        kept = 1.0 if keep is None else min(max((keep - (last - steps)) / steps, 0.0), 1.0)
        start.productive += kept * (in_steps - data)
        lost["data_wait"] += kept * data
        lost["redone"] += (1.0 - kept) * in_steps
        for name in ("mfu", "samples_per_s"):
            value = window.get(name)
            if isinstance(value, (int, float)):
                getattr(start, name).append(float(value))
        straggler = window.get("straggler")
        if isinstance(straggler, dict) and isinstance(straggler.get("host"), str):
            host = straggler["host"]
            start.stragglers[host] = start.stragglers.get(host, 0) + 1
    last_at = float(windows[-1]["at"]) if windows else float(first["at"])
    lost["hang"] = min(hang, max(ended - last_at, 0.0))
    tail = max(ended - last_at - lost["hang"], 0.0)
    if end is not None:  # the final save (and samples) after the last log step
        for cause, key in (("checkpoint", "checkpoint_s"), ("sampling", "sample_s")):
            spent = min(float(end.get(key, 0.0)), tail)
            lost[cause] += spent
            tail -= spent
    lost["after_last_step"] = tail
    accounted = start.productive + sum(lost.values())
    lost["other"] = max(start.allocated - accounted, 0.0)
    return start
