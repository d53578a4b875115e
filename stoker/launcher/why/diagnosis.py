"""What `stoker why` prints (`Diagnosis`), and how every rule of the judge makes one
(`DiagnosisMaker`): the job's exit status, the batch script's restarts, the notes of
what could not be asked, and `JOB` in the fix replaced by the job's id.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from stoker.launcher.jobs.log_text import format_ranges
from stoker.launcher.slurm.query import PENDING_STATES, RUNNING_STATES
from stoker.launcher.why.facts import JobFacts


@dataclass
class Diagnosis:
    """What `stoker why` prints. `cause` is one of: completed, running, pending,
    error (a user error the runtime reported with its fix), exception, exit-code,
    batch-script, time-limit, hung, requeues-exhausted, stop-signal, host-oom, gpu-oom,
    gpu-error, nccl, nccl-timeout, rendezvous, port-in-use, cancelled, preempted,
    node-failure, deadline, unknown."""

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


RESTART_EVENTS = r"restart(ing|ed) (in place|by requeue)|restart(ing|ed) after failure"
"""The batch script's events of a restart after a failure: its decision, what it cost
(the new attempt's first step), and a failure it did not restart for."""


class DiagnosisMaker:
    """Makes the `Diagnosis` of one job's facts; the judge's rules call it."""

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
        # completed after losing a node (restarted in place or requeued, and what each
        # cost), or one left failed with no restart left.
        restarts = event_lines(facts, RESTART_EVENTS, all_restarts=True)
        evidence = [*evidence, *(e for e in restarts if e not in evidence)]
        if facts.laggard is not None:
            evidence.append(
                f"flight recorder (flight/r{facts.restart}/): {facts.laggard.describe()}"
            )
        evidence += [f"note: {n}" for n in facts.notes]
        fix_text = fix.replace("JOB", facts.job_id) if fix else None
        if fix_text and event_lines(facts, "not restarted after failure"):
            fix_text += "; raise job.max_restarts to have such failures restarted by the job"
        return Diagnosis(
            facts.job_id, facts.state, cause, summary, evidence, fix_text, failing_rank, exit_code
        )


def event_lines(facts: JobFacts, regex: str, *, all_restarts: bool = False) -> list[str]:
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


def rank_list(ranks: Sequence[int]) -> str:
    """[3, 0, 1] -> "0-1, 3"."""
    return format_ranges(sorted(ranks))
