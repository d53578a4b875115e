"""The judge: a job's diagnosis from its gathered facts (why/facts.py), a pure function
of them, so every rule is tested on recorded text.

The rules, in the order `judge` applies them: pending and running jobs; a clean
completion; the hang watchdog's report; a dead local supervisor; the time limit
(or a hung rank behind it, why/hang.py); cancellation; SLURM's own end states
(OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE). Else the job failed:
requeues used up; SLURM's or the kernel's word that memory ran out (why/memory.py);
the stop signal not handled; the error the first failing rank reported in
stoker's words (a missing data set, a config the runtime refused), with its fix;
its log signature (why/signatures.py); a SIGKILL with no other cause (host memory
again); its traceback; a signature in another rank's log; its exit code; and last the batch
script itself.
"""

from __future__ import annotations

import pwd
import re
import time

from stoker.launcher.slurm.query import PENDING_STATES, RUNNING_STATES, format_elapsed
from stoker.launcher.why.diagnosis import Diagnosis, DiagnosisMaker, event_lines, rank_list
from stoker.launcher.why.facts import JobFacts
from stoker.launcher.why.hang import hung_by_watchdog, silent_ranks
from stoker.launcher.why.memory import host_memory, memory_kill
from stoker.launcher.why.pending import explain_pending
from stoker.launcher.why.resume import new_run_fix, resume_fix
from stoker.launcher.why.signatures import SignatureHit, find_signature
from stoker.launcher.why.tracebacks import (
    TaskFailure,
    exception_line,
    first_failure,
    last_traceback,
    parse_task_failures,
    stoker_error,
)


def judge(facts: JobFacts) -> Diagnosis:
    """The diagnosis from gathered facts: a pure function; the rules, in order, are in
    the module docstring."""
    state = facts.state
    make = DiagnosisMaker(facts)
    if state in PENDING_STATES:
        return _pending(facts, make)
    if state in RUNNING_STATES:
        return _running(facts, make)
    if state == "COMPLETED" and not parse_task_failures(facts.batch_log):
        return make("completed", "completed successfully (exit 0)", [], None, exit_code=0)
    if facts.hang is not None:
        return hung_by_watchdog(facts, make, facts.hang)
    if facts.supervisor_died:
        return make(
            "node-failure",
            "the local supervisor died (killed, or the machine rebooted) while the job ran",
            [],
            "its ranks may still run: stop them (`ps`), then " + resume_fix(facts),
        )
    timed_out = state == "TIMEOUT" or _find(facts.batch_log, r"DUE TO TIME LIMIT")
    if timed_out:
        return _time_limit(facts, make)
    if state == "CANCELLED":
        return _cancelled(facts, make)
    if state == "OUT_OF_MEMORY":
        return host_memory(facts, make, killed=None, signature=None)
    if state == "NODE_FAIL":
        nodes = facts.node_list or "its nodes"
        return make(
            "node-failure",
            f"a node of the job failed ({nodes}): SLURM lost contact with it",
            [f"sacct: State NODE_FAIL, NodeList {nodes}"],
            resume_fix(facts) + "; if the same node fails again, report it (`sinfo -R` "
            "shows why nodes are down)",
        )
    if state == "PREEMPTED":
        return make(
            "preempted",
            "preempted by a higher-priority job and not requeued",
            event_lines(facts, "stop requested|requeue"),
            resume_fix(facts) + "; a job that saves on the stop signal is requeued by "
            "itself (job.max_requeues)",
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


def _find(text: str, regex: str) -> str | None:
    for line in text.splitlines():
        if re.search(regex, line):
            return line.strip()
    return None


def _pending(facts: JobFacts, make: DiagnosisMaker) -> Diagnosis:
    meaning, fix = explain_pending(facts.reason)
    reason = facts.reason or "None"
    summary = f"pending ({reason}): {meaning}"
    evidence = [f"scontrol: JobState={facts.state} Reason={reason}"]
    if facts.restarts:
        evidence.append(f"requeued {facts.restarts} time(s) so far")
    evidence += event_lines(facts, "requeue", all_restarts=True)[-2:]
    return make("pending", summary, evidence, fix)


def _running(facts: JobFacts, make: DiagnosisMaker) -> Diagnosis:
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
            f"rank(s) {rank_list(silent)} printed nothing for {longest:.0f} s while others did"
        )
        return make(
            "running",
            f"running{elapsed}{where}; rank(s) {rank_list(silent)} may be hung",
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


def _time_limit(facts: JobFacts, make: DiagnosisMaker) -> Diagnosis:
    limit = format_elapsed(facts.time_limit_s) if facts.time_limit_s is not None else "?"
    elapsed = format_elapsed(facts.elapsed_s) if facts.elapsed_s is not None else "?"
    evidence = [f"time limit {limit}, elapsed {elapsed}"]
    line = _find(facts.batch_log, r"DUE TO TIME LIMIT")
    if line:
        evidence.append(f"batch.log: {line}")
    events = event_lines(facts, "stop requested|requeue")
    evidence += events
    silent, longest = silent_ranks(facts)
    if silent:
        talking = sorted(set(facts.rank_mtimes) - set(silent))
        for rank in silent:
            last = facts.rank_logs.get(rank, "").rstrip().splitlines()[-1:]
            evidence.append(f"rank {rank} last printed: {last[0].strip() if last else '(nothing)'}")
        if talking:
            evidence.append(f"rank(s) {rank_list(talking)} kept printing until the end")
        return make(
            "hung",
            f"hung: no output from rank(s) {rank_list(silent)} for {longest:.0f} s before "
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
        "give it more time: to continue from its checkpoints, "
        + new_run_fix(facts, " with a longer --time (job.time)")
        + "; or let it continue by itself: a job that saves and exits 75 when asked to stop "
        "is requeued and resumes (job.max_requeues)"
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


def _cancelled(facts: JobFacts, make: DiagnosisMaker) -> Diagnosis:
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
    evidence += event_lines(facts, "stop requested|not requeued")
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
        "nothing failed; " + resume_fix(facts),
        job_exit=False,
    )


def _stop_signal(facts: JobFacts, make: DiagnosisMaker, first: TaskFailure) -> Diagnosis:
    """Tasks killed by SIGUSR2, the signal that asks them to save and stop."""
    evidence = [f"batch.log: {first.line}", *event_lines(facts, "stop requested")]
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
        f"rank(s) {rank_list(first.ranks)} were killed by the stop signal SIGUSR2, which "
        "they do not handle",
        evidence,
        fix,
        failing_rank=first.ranks[0] if first.ranks else None,
        exit_code=first.status,
    )


def _failed(facts: JobFacts, make: DiagnosisMaker) -> Diagnosis:
    exhausted = event_lines(facts, r"not requeued after .*restarts used")
    if exhausted:
        return make(
            "requeues-exhausted",
            "stopped at its time limit (or preemption) with no requeues left: "
            + exhausted[-1].split(" ", 2)[-1],
            event_lines(facts, "stop requested|requeue", all_restarts=True)[-6:],
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

    memory = memory_kill(facts)
    if memory is not None:
        return host_memory(facts, make, killed=first, signature=memory)
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

    reported = stoker_error(facts.rank_logs.get(rank, "")) if rank is not None else None
    if reported is not None:
        # The runtime's own words for an error the user can fix: the most specific cause.
        log = f"logs/r{facts.restart}/rank-{rank}.log"
        # The rendezvous check's (stoker/runtime/dist/rendezvous.py) has a cause of its own.
        cause = "rendezvous" if reported.message.startswith("rendezvous:") else "error"
        return make(
            cause,
            f"rank {rank}: {reported.message}",
            [*evidence, f"{log}: {reported.line}"],
            reported.fix,
            failing_rank=rank,
            exit_code=status,
        )
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
        return host_memory(facts, make, killed=first, signature=None)
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
        [*(f"batch.log: {line}" for line in last_batch), *event_lines(facts, ".")[-3:]],
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
