"""The `job.*` flags and submission options `stoker submit` and `stoker sweep` share.

One definition each, so both commands take the same flags with the same help, and
their values reach `resolve_config` under the same keys and sources.
"""

from __future__ import annotations

from typing import Any

import typer

NODES: Any = typer.Option(None, "--nodes", "-N", help="Nodes (job.nodes).")
NTASKS_PER_NODE: Any = typer.Option(
    None, "--ntasks-per-node", help="Tasks per node (job.ntasks_per_node)."
)
GPUS_PER_NODE: Any = typer.Option(
    None, "--gpus-per-node", help="GPUs per node (job.gpus_per_node)."
)
CPUS_PER_TASK: Any = typer.Option(
    None, "--cpus-per-task", help="CPU cores per task (job.cpus_per_task)."
)
MEM: Any = typer.Option(None, "--mem", help="Memory per node, e.g. 64G (job.mem).")
TIME: Any = typer.Option(None, "--time", "-t", help="Time limit, e.g. 04:00:00 (job.time).")
PARTITION: Any = typer.Option(None, "--partition", "-p", help="Partition (job.partition).")
NAME: Any = typer.Option(None, "--name", "-J", help="Job name (job.name).")
AFTER: Any = typer.Option(None, "--after", help="Start after this job has completed successfully.")
DRY_RUN: Any = typer.Option(False, "--dry-run", help="Print the sbatch script, submit nothing.")
EXPLAIN: Any = typer.Option(
    False, "--explain", help="Print the script with the source of each #SBATCH value."
)
CODE: Any = typer.Option(
    None, "--code", help="Snapshot this folder instead of the git repository of the cwd."
)
NO_SNAPSHOT: Any = typer.Option(
    False, "--no-snapshot", help="Run the code where it is, not from a snapshot."
)
NO_CHECK: Any = typer.Option(
    False,
    "--no-check",
    help="Skip the checks made from here: the model's (built on the meta device, forward "
    "on a meta batch) and what the job reads (data sets, checkpoint root, script), for "
    "paths only the compute nodes see.",
)
PROFILE: Any = typer.Option(None, "--profile", help="Site profile to use.")
NO_PROFILE: Any = typer.Option(False, "--no-profile", help="Ignore the site profile.")
