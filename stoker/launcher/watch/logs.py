"""`stoker logs`: the per-rank logs of a job, merged, and followed across requeues.

What is read (see jobs/rundir.py): `logs/r<R>/rank-<T>.log`, task T's output in restart R,
and `logs/batch.log`, the batch shell's output (srun's and slurmstepd's messages,
the stop protocol's `stoker: ...` lines), one file for all restarts.

Order. The files carry no time stamps, so lines are merged by reading position:

- a finished (or not followed) job prints restart by restart, oldest first, with
  `--- restart R ---` before each restart after the first; within a restart, rank
  by rank (all of rank 0, then rank 1, ...), then that restart's batch.log lines.
  Rank by rank keeps a traceback in one piece; the batch lines come last because
  they mostly say how the ranks ended.
- `-f` prints what is there the same way, then every new line as it arrives,
  polling all files twice a second; new rank files and restart folders are picked
  up as they appear. Lines that arrive in the same poll are printed rank by rank.

Each line is prefixed with its source: `[3] ` for rank 3, `[batch] ` for batch.log.
A line that redraws itself with carriage returns (a progress bar) shows its last
state, as a terminal would.

batch.log spans all restarts; jobs/log_text.py splits it by restart, at the lines
that end one (the batch script's `stoker: requeued after ...`, or slurmstepd's `... DUE
TO JOB REQUEUE ***` and srun's teardown after a requeue from outside) or at a `stoker:
start restart=R` line.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stoker.errors import StokerError
from stoker.launcher.jobs.log_text import format_ranges, split_batch_by_restart
from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.jobs.targets import Target
from stoker.launcher.local.state import process_alive, read_local_state

BATCH = "batch"
_READ_CHUNK = 1 << 20


# ---------------------------------------------------------------- filter


@dataclass(frozen=True)
class LogFilter:
    """What to show. `restart` None means all restarts; `tail` counts per rank (and
    for batch.log) within each restart shown, after `pattern` has filtered."""

    rank: int | None = None
    pattern: re.Pattern[str] | None = None
    tail: int | None = None
    restart: int | None = None
    batch: bool = True

    def wants_source(self, source: int | str) -> bool:
        if source == BATCH:  # the batch script's lines are no rank's
            return self.batch and self.rank is None
        return self.rank is None or source == self.rank

    def wants_restart(self, restart: int) -> bool:
        return self.restart is None or restart == self.restart

    def matches(self, text: str) -> bool:
        return self.pattern is None or self.pattern.search(text) is not None


def compile_grep(expression: str) -> re.Pattern[str]:
    """`--grep` as a regular expression; an invalid one is a StokerError naming it."""
    try:
        return re.compile(expression)
    except re.error as exc:
        raise StokerError(
            f"--grep {expression!r} is not a valid regular expression: {exc}",
            fix="use Python regex syntax; escape special characters, e.g. --grep 'loss\\['",
        ) from exc


def parse_restart(value: str) -> int | None:
    """`--restart`: "all" (None), "last" (-1), or a restart number."""
    text = value.strip().lower()
    if text == "all":
        return None
    if text == "last":
        return -1
    if text.isdigit():
        return int(text)
    raise StokerError(
        f"--restart {value!r} is not a restart number",
        fix="give 0 for the first start, 1 after the first requeue, ..., or 'last' or 'all'",
    )


# ---------------------------------------------------------------- reading files


def _clean(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="replace").rstrip("\r")
    # A progress bar redraws its line with \r: keep what a terminal would show last.
    return text.rsplit("\r", 1)[-1]


@dataclass
class LogFile:
    """One log file read incrementally: complete lines only, until `final`."""

    path: Path
    offset: int = 0
    partial: bytes = b""

    def lines(self, *, final: bool = False) -> Iterator[str]:
        """New complete lines since the last call; with `final`, also an unfinished last
        line. A file that shrank (rewritten) is read again from its start."""
        try:
            handle = open(self.path, "rb")  # noqa: SIM115 (closed below, across yields)
        except OSError:
            return
        try:
            size = os.fstat(handle.fileno()).st_size
            if size < self.offset:
                self.offset, self.partial = 0, b""
            handle.seek(self.offset)
            while True:
                chunk = handle.read(_READ_CHUNK)
                if not chunk:
                    break
                self.offset += len(chunk)
                data = self.partial + chunk
                *complete, self.partial = data.split(b"\n")
                for raw in complete:
                    yield _clean(raw)
        finally:
            handle.close()
        if final and self.partial:
            text, self.partial = self.partial, b""
            yield _clean(text)


def _tail(lines: Iterable[str], count: int | None) -> Iterable[str]:
    if count is None:
        return lines
    return deque(lines, maxlen=count) if count > 0 else ()


def _prefix(source: int | str) -> str:
    return f"[{source}] "


def separator(restart: int) -> str:
    return f"--- restart {restart} ---"


# ---------------------------------------------------------------- the reader


@dataclass
class LogReader:
    """All log files of one run folder, each read once, in the documented order.

    `snapshot()` prints what is there now; `poll()` what arrived since. `write`
    gets whole output lines (prefix included, no newline).
    """

    run: RunDir
    filter: LogFilter
    write: Callable[[str], None]
    files: dict[tuple[int, int], LogFile] = field(default_factory=dict)
    batch: LogFile | None = None
    # The newest restart whose separator has been printed (-1: none yet).
    newest_shown: int = -1
    # Lines read from the files, before any filter: tells a follower they still grow.
    lines_read: int = 0

    def __post_init__(self) -> None:
        self.batch = LogFile(self.run.batch_log)

    def restarts(self) -> list[int]:
        return self.run.restarts_logged()

    def has_output(self) -> bool:
        """Any log written yet (a pending job has none)."""
        try:
            if self.run.batch_log.stat().st_size > 0:
                return True
        except OSError:
            pass
        return any(self.run.rank_logs(r) for r in self.restarts())

    def check_selection(self) -> None:
        """Refuse a --restart or --rank that names nothing, listing what exists."""
        restarts = self.restarts()
        wanted = self.filter.restart
        if wanted is not None and wanted != -1 and restarts and wanted not in restarts:
            raise StokerError(
                f"--restart {wanted}: the job has logs of restart(s) "
                f"{', '.join(map(str, restarts))}",
                fix="pick one of those, or --restart all",
            )
        rank = self.filter.rank
        if rank is not None and restarts:
            ranks = sorted({r for restart in restarts for r in self.run.rank_logs(restart)})
            if ranks and rank not in ranks:
                raise StokerError(
                    f"--rank {rank}: the job has logs of rank(s) {format_ranges(ranks)}",
                    fix="pick one of those ranks",
                )

    def _wanted_restarts(self, restarts: Sequence[int]) -> list[int]:
        if self.filter.restart == -1:
            return list(restarts[-1:])
        return [r for r in restarts if self.filter.wants_restart(r)]

    def _matching(self, log: LogFile, final: bool) -> Iterator[str]:
        """New lines of one file that pass the filter, streamed (a log may be GBs)."""
        for text in log.lines(final=final):
            self.lines_read += 1
            if self.filter.matches(text):
                yield text

    def _rank_files(self, restart: int) -> list[tuple[int, LogFile]]:
        files = []
        for rank, path in self.run.rank_logs(restart).items():
            if self.filter.wants_source(rank):
                files.append((rank, self.files.setdefault((restart, rank), LogFile(path))))
        return files

    def _batch_lines(self, final: bool) -> list[str]:
        # batch.log is small: srun's messages and the batch script's own lines.
        if not self.filter.wants_source(BATCH) or self.batch is None:
            return []
        lines = list(self.batch.lines(final=final))
        self.lines_read += len(lines)
        return lines

    def _show(self, restart: int) -> None:
        """The separator before restart R >= 1, printed once."""
        if restart > self.newest_shown:
            if restart >= 1:
                self._emit(separator(restart))
            self.newest_shown = restart

    def _emit(self, text: str) -> None:
        self.write(text)

    def snapshot(self, *, final: bool) -> None:
        """Print what the files hold now, in the documented order, --tail applied.
        `final` also prints unfinished last lines (the job has ended)."""
        restarts = self.restarts()
        shown = self._wanted_restarts(restarts)
        batch = split_batch_by_restart(self._batch_lines(final), restarts)
        # Before any rank has a log folder (pending, setup failed) batch.log is all there is.
        for restart in shown or sorted(batch):
            self._show(restart)
            for rank, log in self._rank_files(restart):
                self._emit_all(rank, _tail(self._matching(log, final), self.filter.tail))
            kept = (t for t in batch.get(restart, []) if self.filter.matches(t))
            self._emit_all(BATCH, _tail(kept, self.filter.tail))

    def poll(self, *, final: bool = False) -> int:
        """Print the lines that arrived since the last call; returns how many lines the
        files grew by (filtered out or not). New batch.log lines belong to the newest
        restart."""
        before = self.lines_read
        restarts = self.restarts()
        shown = self._wanted_restarts(restarts)
        for restart in shown:
            for rank, log in self._rank_files(restart):
                lines = list(self._matching(log, final))
                if lines:
                    self._show(restart)
                    self._emit_all(rank, lines)
        newest = restarts[-1] if restarts else 0
        batch = [t for t in self._batch_lines(final) if self.filter.matches(t)]
        if batch and (newest in shown or not shown):
            self._show(newest)
            self._emit_all(BATCH, batch)
        return self.lines_read - before

    def _emit_all(self, source: int | str, lines: Iterable[str]) -> None:
        prefix = _prefix(source)
        for text in lines:
            self._emit(prefix + text)


# ---------------------------------------------------------------- job state


@dataclass(frozen=True)
class JobState:
    state: str  # SLURM's name ("PENDING", "RUNNING", ...), or "UNKNOWN"
    reason: str | None
    ended: bool


def job_state(target: Target) -> JobState:
    """The job's state from ONE scheduler call (squeue), or from local-state.json.

    A job squeue no longer knows has ended; a failing squeue reads as "UNKNOWN",
    not ended, so a follower keeps going.
    """
    from stoker.launcher.slurm.cli import SlurmError
    from stoker.launcher.slurm.query import TERMINAL_STATES, query_queue

    record = target.record
    if record.backend == "local":
        local = read_local_state(target.run)
        if local is None:
            return JobState("UNKNOWN", "no local-state.json yet", False)
        pid = local.supervisor_pid
        if local.state == "RUNNING" and pid is not None and not process_alive(pid, local.started):
            return JobState("FAILED", "supervisor died", True)
        return JobState(local.state, None, local.state != "RUNNING")
    if record.final_state and target.task is None:
        return JobState(record.final_state, None, True)
    try:
        rows = query_queue([target.job_id])
    except SlurmError as exc:
        return JobState("UNKNOWN", exc.message.splitlines()[0], False)
    row = rows.get(target.job_id)
    if row is None:
        return JobState("ENDED", "no longer in the queue", True)
    return JobState(row.state, row.reason, row.state in TERMINAL_STATES)


# ---------------------------------------------------------------- follow


@dataclass(frozen=True)
class FollowTiming:
    """Seconds between file polls, between state checks, and of quiet after the end."""

    poll_s: float = 0.5
    state_every_s: float = 3.0
    settle_s: float = 1.0


def follow(
    reader: LogReader,
    is_ended: Callable[[], bool],
    timing: FollowTiming | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Print what is there, then new lines as they come, until `is_ended()` said so
    and no file has grown for `settle_s`. Ctrl-C (KeyboardInterrupt) is the caller's."""
    timing = timing or FollowTiming()
    reader.snapshot(final=False)
    next_check = time.monotonic()
    ended_at: float | None = None
    while True:
        now = time.monotonic()
        if ended_at is None and now >= next_check:
            if is_ended():
                ended_at = now
            next_check = now + timing.state_every_s
        grew = reader.poll() > 0
        if ended_at is not None:
            if grew:
                ended_at = time.monotonic()
            elif time.monotonic() - ended_at >= timing.settle_s:
                reader.poll(final=True)
                return
        sleep(timing.poll_s)
