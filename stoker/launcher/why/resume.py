"""How a job that stopped before its end continues from its checkpoints: `stoker why`'s
advice for a cancelled, preempted or node-failed job, worded as what works for this job
(docs/jobs.md, "Continuing a stopped job").

`stoker requeue` runs the job again in its own run folder, where the runtime finds its
checkpoints (`checkpoint.root` defaults to `<run folder>/checkpoints`); a local job
always, a SLURM job while slurmctld still knows it (MinJobAge after its end). A new
submission gets a new run folder, so it continues only where its `checkpoint.root`
names the old checkpoints.
"""

from __future__ import annotations

import shlex

from stoker.launcher.why.facts import JobFacts

_AGAIN = "runs it again in its run folder, where it continues from its newest checkpoint"


def resume_fix(facts: JobFacts) -> str:
    """The way to continue the job, for a diagnosis' fix (`JOB` stands for its id)."""
    if facts.backend == "local":
        return f"`stoker requeue JOB` {_AGAIN}"
    new_run = new_run_fix(facts)
    if facts.slurm_forgot:
        return f"SLURM no longer knows the job, so it cannot be requeued: {new_run}"
    return f"`stoker requeue JOB` {_AGAIN}; once SLURM has forgotten it (MinJobAge), {new_run}"


def new_run_fix(facts: JobFacts, options: str = "") -> str:
    """How a new submission (with `options`, e.g. a longer --time) continues from the
    job's checkpoints: "submit it again ..."."""
    root = facts.checkpoint_root
    if facts.checkpoint_root_set:
        return f"submit it again{options}: its checkpoint.root ({root}) holds its checkpoints"
    joined = f"{options} and" if options else " with"
    setting = shlex.quote(f"checkpoint.root={root}")  # pasted into a shell
    return f"submit it again{joined} {setting} (a new run folder has no checkpoints of its own)"
