"""Hung jobs: a rank the hang watchdog named (heartbeat/r<R>/hang.json, with the
stacks every rank dumped into its log), or ranks whose logs went silent long before
the end (or now, for a running job).
"""

from __future__ import annotations

import re
import time
from typing import Any

from stoker.launcher.why.diagnosis import Diagnosis, DiagnosisMaker
from stoker.launcher.why.facts import JobFacts
from stoker.launcher.why.tracebacks import TRACEBACK_MAX_LINES, strip_line_prefix
from stoker.protocol import HANG_FILE, STACK_HEADER

# A rank is "hung" when it printed nothing for this long before the end:
# max(HUNG_MIN_S, HUNG_FRACTION of the elapsed time, capped at HUNG_CAP_S).
HUNG_MIN_S = 30.0
HUNG_FRACTION = 0.25
HUNG_CAP_S = 1800.0

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
    lines = [strip_line_prefix(line) for line in text.splitlines()]
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


def hung_by_watchdog(facts: JobFacts, make: DiagnosisMaker, hang: dict[str, Any]) -> Diagnosis:
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
    return make(
        "hung",
        f"the hang watchdog failed the job: {hang['message']}",
        evidence,
        fix,
        failing_rank=rank,
    )


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
