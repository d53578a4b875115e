"""Host memory: how `stoker why` tells that a job ran out of it.

Where SLURM runs without cgroups and without memory accounting (TaskPlugin=task/none,
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

import re

from stoker.launcher.why.diagnosis import Diagnosis, DiagnosisMaker, rank_list
from stoker.launcher.why.facts import JobFacts
from stoker.launcher.why.signatures import HOST_MEMORY_FIX, SignatureHit, find_signature
from stoker.launcher.why.tracebacks import TaskFailure

# MaxRSS of one task times tasks per node at or above this share of ReqMem is "near".
MEM_NEAR = 0.9
_LIMIT_NUMBERS = re.compile(r"\((\d+) > (\d+)\)")


def format_bytes(count: int) -> str:
    """434839552 -> "414.7 MiB": binary units, as SLURM's K, M and G are."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


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


def memory_kill(facts: JobFacts) -> SignatureHit | None:
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


def host_memory(
    facts: JobFacts,
    make: DiagnosisMaker,
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
        who = f"ranks {rank_list(killed.ranks)}"
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
        HOST_MEMORY_FIX,
        failing_rank=rank,
        exit_code=killed.status if killed else None,
    )
