"""The contract between the batch script, the launcher and the tasks it starts.

Both sides import this module: the launcher (templates, `status`, `why`) and the
runtime, which learns about the job only through these environment variables,
exit codes and files. Nothing here imports SLURM knowledge into the tasks.
"""

from __future__ import annotations

import re

# A task that saved its state after a stop request exits with this code; the batch
# script then requeues the job (EX_TEMPFAIL from sysexits.h: "try again later").
EXIT_REQUEUE = 75

# A task whose collective failed because a peer went away (killed, frozen, its node
# lost) exits with this code, so that the batch script tells a lost rank, which it
# restarts (job.max_restarts), from the program's own error, which it does not
# (EX_PROTOCOL from sysexits.h: "remote error in protocol").
EXIT_PEER_LOST = 76

# A task that saved its state after SIGTERM (scancel, or SLURM's own requeue) exits as a
# process killed by it would: SLURM requeues or ends the job itself.
EXIT_TERMINATED = 128 + 15

# The signal SLURM sends the batch shell before the time limit (`--signal=B:USR2@grace`).
# Never USR1: NCCL uses it.
STOP_SIGNAL = "USR2"
# Seconds between that signal and the time limit: job.stop_grace.

# The training runtime's module (`python -m stoker.runtime.train`). Its tasks start with
# SIGUSR2 ignored (the batch script's task wrapper): the stop signal may come while
# Python imports torch, before the runtime's handler exists, and would kill the task.
# The runtime learns of that stop from the stop file.
TRAIN_MODULE = "stoker.runtime.train"


# A Python function as a job (`stoker.submit(fn, *args)`): each task runs
# `python -m stoker.runtime.function_task`, which calls the submitit DelayedSubmission
# pickled in <run>/function/submission.pkl; global rank 0 writes ("success", value) or
# ("error", traceback text) to <run>/function/result.pkl (submitit's own layout). On a stop
# a submitit Checkpointable's checkpoint() replaces submission.pkl before EXIT_REQUEUE.
FUNCTION_MODULE = "stoker.runtime.function_task"
FUNCTION_DIR = "function"
SUBMISSION_FILE = "submission.pkl"
RESULT_FILE = "result.pkl"

# The model check before a job starts (stoker/runtime/preflight.py): run as a child
# process, exit 0 when the model builds for the data, PREFLIGHT_REFUSED with a JSON
# {"key", "message", "fix"} on stdout when it does not.
PREFLIGHT_MODULE = "stoker.runtime.preflight"
PREFLIGHT_REFUSED = 3


def runs_the_runtime(argv: list[str]) -> bool:
    """Whether a task command is the training runtime (python -m stoker.runtime.train)."""
    return argv[1:3] == ["-m", TRAIN_MODULE]


# Set for every task.
ENV_RUN_DIR = "STOKER_RUN_DIR"  # the task's run folder (an array task's own folder)
ENV_JOB_ID = "STOKER_JOB_ID"  # "123", or "123_4" for array task 4
ENV_RESTART = "STOKER_RESTART"  # 0 on the first start, +1 per requeue
ENV_STOP_FILE = "STOKER_STOP_FILE"  # exists once a stop was requested: save, exit EXIT_REQUEUE
ENV_PROGRESS_FILE = "STOKER_PROGRESS_FILE"  # rank 0 writes its progress here (JSON)
ENV_CONFIG = "STOKER_CONFIG"  # the frozen experiment config (YAML)

# The hang watchdog (stoker/runtime/observe/heartbeat.py): every rank's heartbeat in
# <run>/heartbeat/r<restart>/rank-<R>.json; when a rank stalls, global rank 0
# writes HANG_FILE there, every rank dumps its Python stacks into its log after
# a line starting with STACK_HEADER, and exits EXIT_HANG. `stoker why` reads both.
HEARTBEAT_DIR = "heartbeat"
HANG_FILE = "hang.json"
# A rank's exit code, written there as soon as it decided it (before it closes MLflow
# and the process group): {"exit_code": N, "written_at": epoch s}. A rank SLURM kills
# after that (its step was cancelled while it exited) ended as it said, on a good node.
EXIT_FILE = "rank-{rank}.exit.json"
STACK_HEADER = "stoker: Python stacks of rank"
# Where each start's time went (stoker/runtime/observe/time_account.py writes, global rank 0):
# <run>/accounting/r<restart>.jsonl, read into a job's time account (goodput).
ACCOUNTING_DIR = "accounting"
# PyTorch's flight recorder (its recent collectives, per rank): each rank writes
# <run>/flight/r<restart>/rank-<R>.json (torch's JSON dump) when the hang watchdog fails
# the job or its collective loses a peer; `stoker why` reads them.
FLIGHT_DIR = "flight"
FLIGHT_FILE = "rank-{rank}.json"
EXIT_HANG = 124  # as timeout(1) exits

# progress.json (ENV_PROGRESS_FILE) carries the last log window's slowest rank; a rank
# that takes more than this times the median rank's time to get ready for the step's
# all-reduce is a straggler: every rank waits for it, every step. The runtime's console
# line and `stoker status` flag it.
STRAGGLER_RATIO = 1.2
# Fewer steps of a start than this name no straggler: its first steps carry each rank's
# start-up (the loader's first fetch, lazy initialisation), which differ by rank.
STRAGGLER_MIN_STEPS = 5


def is_straggler(ratio: float | None, steps_done: int | None) -> bool:
    """The straggler verdict of the runtime's console line and `stoker status`: the slowest
    rank's ratio to the median is over STRAGGLER_RATIO, after STRAGGLER_MIN_STEPS steps of
    this start (`steps_done`; None when unknown: judged)."""
    if ratio is None or ratio <= STRAGGLER_RATIO:
        return False
    return steps_done is None or steps_done >= STRAGGLER_MIN_STEPS


def expand_nodelist(nodelist: str) -> list[str]:
    """SLURM's compressed host list, as `scontrol show hostnames` expands it:
    "n[1-3,5],gpu-[01-02]" -> n1 n2 n3 n5 gpu-01 gpu-02 (zero padding kept)."""
    names: list[str] = []
    for prefix, ranges in re.findall(r"([^,\[]+)(?:\[([^\]]*)\])?,?", nodelist):
        if not ranges:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            width = len(low)
            for number in range(int(low), int(high or low) + 1):
                names.append(f"{prefix}{number:0{width}d}")
    return names
