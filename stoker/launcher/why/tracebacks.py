"""What a failed job's logs say about its tasks: srun's "task N: ..." lines in
batch.log, the first task that failed, and the last Python traceback of a rank's log.

srun prints the task that failed first, then those --kill-on-bad-exit terminated;
the local supervisor words its lines the same way, so both read alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

TRACEBACK_MAX_LINES = 30

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


def strip_line_prefix(line: str) -> str:
    """`line` without the rank prefix torch.distributed or a launcher put before it."""
    return _LINE_PREFIX.sub("", line, count=1)


def last_traceback(text: str, max_lines: int = TRACEBACK_MAX_LINES) -> list[str] | None:
    """The last Python traceback in `text`, through its exception line; middle frames
    are elided to keep at most `max_lines` lines. None if there is none."""
    lines = [strip_line_prefix(line.rstrip("\r")) for line in text.splitlines()]
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


# ---------------------------------------------------------------- stoker's own errors

# How the runtime reports an error the user can fix (stoker/runtime/train.py prints a
# StokerError so): "stoker: rank N: MESSAGE", then "  fix: FIX" when it has one.
_STOKER_ERROR = re.compile(r"^stoker: rank (?P<rank>\d+): (?P<message>.+)$")
_FIX = re.compile(r"^\s+fix: (?P<fix>.+)$")
# The runtime's own notes on how a rank ended, which are no error of the user's.
_NOT_AN_ERROR = ("stopped by the hang watchdog", "a collective lost a peer")


@dataclass(frozen=True)
class StokerErrorLine:
    """The error a rank reported in stoker's words, with its fix."""

    rank: int
    message: str
    fix: str | None
    line: str  # the message line as the log has it


def stoker_error(text: str) -> StokerErrorLine | None:
    """The last user error the runtime reported in a rank's log `text`, if any."""
    lines = [strip_line_prefix(line.rstrip("\r")) for line in text.splitlines()]
    for i in range(len(lines) - 1, -1, -1):
        match = _STOKER_ERROR.match(lines[i])
        if match is None or match["message"].startswith(_NOT_AN_ERROR):
            continue
        fix = _FIX.match(lines[i + 1]) if i + 1 < len(lines) else None
        return StokerErrorLine(
            int(match["rank"]),
            match["message"].strip(),
            fix["fix"].strip() if fix else None,
            lines[i].strip(),
        )
    return None
