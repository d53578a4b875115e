"""`stoker why`: why a job ended the way it did (or why it has not started).

Facts are gathered once (`gather_facts`, why/facts.py), then judged by a pure
function (`judge`, why/judge.py), so every rule can be tested on recorded text.
What the judge reads in the facts has a module each: srun's task lines and the
tracebacks (tracebacks.py), log signatures (signatures.py), pending reasons
(pending.py), host memory (memory.py) and hangs (hang.py).
"""

from __future__ import annotations

from stoker.launcher.jobs.targets import Target
from stoker.launcher.why.diagnosis import Diagnosis
from stoker.launcher.why.facts import JobFacts, gather_facts
from stoker.launcher.why.judge import judge
from stoker.launcher.why.pending import explain_pending
from stoker.launcher.why.signatures import SIGNATURES, find_signature
from stoker.launcher.why.tracebacks import (
    exception_line,
    first_failure,
    last_traceback,
    parse_task_failures,
)

__all__ = [
    "SIGNATURES",
    "Diagnosis",
    "JobFacts",
    "diagnose",
    "exception_line",
    "explain_pending",
    "find_signature",
    "first_failure",
    "gather_facts",
    "judge",
    "last_traceback",
    "parse_task_failures",
]


def diagnose(target: Target) -> Diagnosis:
    """Gather the facts of one job (or array task) and judge them."""
    return judge(gather_facts(target))
