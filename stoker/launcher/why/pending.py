"""Why a job has not started: SLURM's pending reason (squeue's and scontrol's
`Reason`) in words, and what to do about it.
"""

from __future__ import annotations

PENDING_REASONS: tuple[tuple[str, str, str], ...] = (
    # (reason prefix, what it means, what to do)
    (
        "Resources",
        "waiting for enough idle nodes/GPUs/CPUs for its request",
        "wait; a smaller request (fewer nodes or GPUs) or a shorter --time lets the "
        "backfill scheduler start it sooner; `squeue --start -j JOB` shows SLURM's estimate",
    ),
    (
        "Priority",
        "jobs with a higher priority are ahead of it in the queue",
        "wait; `sprio -j JOB` shows its priority factors",
    ),
    (
        "QOSMaxJobsPerUserLimit",
        "you already run the most jobs your QOS allows",
        "wait for one of your jobs to end, or use another QOS (--qos)",
    ),
    (
        "QOSMax",
        "a limit of the job's QOS is reached",
        "wait, or ask for less or use another QOS (`sacctmgr show qos` lists the limits)",
    ),
    (
        "QOSGrp",
        "the QOS's group limit (jobs, CPUs, GPUs of all its users) is reached",
        "wait, or use another QOS",
    ),
    (
        "AssocGrp",
        "the account's group limit (CPUs, GPUs, jobs) is reached",
        "wait, or use another account (--account)",
    ),
    (
        "AssocMax",
        "a per-job or per-user limit of the account is reached",
        "ask for less, or use another account",
    ),
    (
        "ReqNodeNotAvail",
        "a node it needs is down, drained or reserved",
        "wait, or drop the node or feature requirement (job.constraint); `sinfo -R` says why "
        "nodes are unavailable",
    ),
    (
        "DependencyNeverSatisfied",
        "a job it depends on (--after) failed: it can never start",
        "cancel it (`stoker cancel JOB`) and submit again without --after",
    ),
    (
        "Dependency",
        "waiting for the job(s) it depends on (--after) to finish",
        "nothing to do; `scontrol show job JOB | grep Dependency` shows them",
    ),
    (
        "BeginTime",
        "its start time is in the future; SLURM holds a requeued job about two "
        "minutes before it may start again",
        "`scontrol update JobId=JOB StartTime=now` lets it start at once",
    ),
    (
        "JobHeldUser",
        "held by its owner (`stoker requeue --hold`, `scontrol hold`)",
        "`scontrol release JOB`",
    ),
    ("JobHeldAdmin", "held by an administrator", "ask the cluster's administrators"),
    (
        "launch failed requeued held",
        "the job failed to launch on its nodes and was held",
        "`scontrol release JOB`; if it fails again, run `stoker doctor` and report the nodes",
    ),
    (
        "PartitionTimeLimit",
        "its --time is above the partition's MaxTime: it will never start",
        "lower job.time to the partition's limit (`stoker doctor` lists partitions)",
    ),
    (
        "PartitionNodeLimit",
        "it asks for more nodes than the partition allows",
        "ask for fewer nodes, or use another partition",
    ),
    ("PartitionDown", "the partition is down", "wait, or use another partition"),
    ("PartitionInactive", "the partition is inactive", "use another partition"),
    ("Reservation", "waiting for its reservation to start", "wait for the reservation"),
    (
        "BadConstraints",
        "no node can satisfy its constraints",
        "fix job.constraint or the resource request",
    ),
    ("InvalidAccount", "its account is not valid", "set job.account to an account you may use"),
    ("InvalidQOS", "its QOS is not valid", "set job.qos to a QOS you may use"),
    ("None", "just submitted: the scheduler has not looked at it yet", "wait a few seconds"),
)


def explain_pending(reason: str | None) -> tuple[str, str]:
    """(meaning, fix) of squeue's pending reason."""
    text = (reason or "None").strip()
    for prefix, meaning, fix in PENDING_REASONS:
        if text.startswith(prefix):
            return meaning, fix
    return (
        f"SLURM's reason code {text}",
        "see JOB REASON CODES in `man squeue`, or ask the cluster's administrators",
    )
