"""The text of a job's logs, read the same way by `stoker logs` (watch/logs.py) and
`stoker why` (why/): batch.log split by restart, and rank numbers as ranges.

batch.log spans all restarts. It is split at the lines that end a restart: the
batch script's `stoker: requeued after ...` line, and for a requeue from outside
(`scontrol requeue`) slurmstepd's `... DUE TO JOB REQUEUE ***` line and srun's
teardown messages that follow it. A `stoker: start restart=R` line, if the batch
script prints one, marks the start of restart R exactly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# slurmd's teardown of a step, after a requeue from outside: the restart's last lines.
_STEP_TEARDOWN_END = re.compile(r"^srun: launch/slurm: _step_signal: Terminating StepId=")
_RESTART_START = re.compile(r"^stoker: start restart=(\d+)")
_REQUEUED_BY_SCRIPT = re.compile(r"^stoker: requeued after .*: restart (\d+)")
_REQUEUED_FROM_OUTSIDE = re.compile(r"\*\*\* JOB \S+ ON \S+ CANCELLED AT \S+ DUE TO JOB REQUEUE")


def split_batch_by_restart(lines: Sequence[str], restarts: Sequence[int]) -> dict[int, list[str]]:
    """batch.log's lines by the restart they belong to (module docstring for the rules).

    `restarts` are the restart numbers that have a log folder, oldest first; lines
    before the first known boundary belong to the first of them.
    """
    known = list(restarts) or [0]
    chunks: dict[int, list[str]] = {}
    if any(_RESTART_START.match(line) for line in lines):
        current = known[0]
        for line in lines:
            match = _RESTART_START.match(line)
            if match:
                current = int(match.group(1))
            chunks.setdefault(current, []).append(line)
        return chunks
    index = 0  # position in `known`
    after_outside_requeue = False
    for line in lines:
        current = known[min(index, len(known) - 1)]
        chunks.setdefault(current, []).append(line)
        match = _REQUEUED_BY_SCRIPT.match(line)
        if match:
            next_restart = int(match.group(1))
            index = known.index(next_restart) if next_restart in known else index + 1
            after_outside_requeue = False
        elif _REQUEUED_FROM_OUTSIDE.search(line):
            after_outside_requeue = True
        elif after_outside_requeue and _STEP_TEARDOWN_END.match(line):
            index += 1
            after_outside_requeue = False
    return chunks


def format_ranges(numbers: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    parts: list[str] = []
    start = prev = None
    for n in numbers:
        if prev is not None and n == prev + 1:
            prev = n
            continue
        if start is not None:
            parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = n
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ", ".join(parts)
