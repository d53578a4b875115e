"""`stoker submit`: validate, snapshot, pre-create the MLflow run, render, check, submit."""

from __future__ import annotations

from pathlib import Path

import typer

from stoker.cli.config import split_experiment_args


def submit(
    args: list[str] = typer.Argument(
        None,
        metavar="[EXP.yaml] [KEY=VALUE ...] [-- CMD ...]",
        help="Experiment file (default: the built-in experiment), overrides, and after `--` "
        "the command each task runs (default: the training runtime).",
    ),
    nodes: int = typer.Option(None, "--nodes", "-N", help="Nodes (job.nodes)."),
    ntasks_per_node: int = typer.Option(
        None, "--ntasks-per-node", help="Tasks per node (job.ntasks_per_node)."
    ),
    gpus_per_node: int = typer.Option(
        None, "--gpus-per-node", help="GPUs per node (job.gpus_per_node)."
    ),
    cpus_per_task: int = typer.Option(
        None, "--cpus-per-task", help="CPU cores per task (job.cpus_per_task)."
    ),
    mem: str = typer.Option(None, "--mem", help="Memory per node, e.g. 64G (job.mem)."),
    time: str = typer.Option(None, "--time", "-t", help="Time limit, e.g. 04:00:00 (job.time)."),
    partition: str = typer.Option(None, "--partition", "-p", help="Partition (job.partition)."),
    name: str = typer.Option(None, "--name", "-J", help="Job name (job.name)."),
    after: str = typer.Option(
        None, "--after", help="Start after this job has completed successfully."
    ),
    dry_run: bool = typer.Option(
        False, "--dry-run", help="Print the sbatch script and submit nothing."
    ),
    explain: bool = typer.Option(
        False, "--explain", help="With --dry-run: show where each #SBATCH value came from."
    ),
    local: bool = typer.Option(
        False, "--local", help="Run the same launch as local processes, without SLURM."
    ),
    code: Path = typer.Option(
        None, "--code", help="Snapshot this folder instead of the git repository of the cwd."
    ),
    no_snapshot: bool = typer.Option(
        False, "--no-snapshot", help="Run the code where it is, not from a snapshot."
    ),
    as_json: bool = typer.Option(
        False, "--json", help='Print {"job_id", "run_id", "run_dir"} as the last line.'
    ),
    profile: Path = typer.Option(None, "--profile", help="Site profile to use."),
    no_profile: bool = typer.Option(False, "--no-profile", help="Ignore the site profile."),
) -> None:
    """Submit an experiment, or any command, as a SLURM job and return at once.

    Examples:

      stoker submit exp.yaml train.steps=2000 --nodes 2 --gpus-per-node 8

      stoker submit --nodes 2 --ntasks-per-node 2 -- python my_train.py --lr 3e-4

      stoker submit exp.yaml --dry-run --explain
    """
    import json
    import sys

    from stoker.cli.output import note, out
    from stoker.cli.trailing import trailing_command
    from stoker.config import resolve_config
    from stoker.launcher.submit import SubmitOptions
    from stoker.launcher.submit import submit as do_submit

    experiment, overrides = split_experiment_args(args or [])
    flags = {
        "job.nodes": (nodes, "--nodes"),
        "job.ntasks_per_node": (ntasks_per_node, "--ntasks-per-node"),
        "job.gpus_per_node": (gpus_per_node, "--gpus-per-node"),
        "job.cpus_per_task": (cpus_per_task, "--cpus-per-task"),
        "job.mem": (mem, "--mem"),
        "job.time": (time, "--time"),
        "job.partition": (partition, "--partition"),
        "job.name": (name, "--name"),
    }
    resolved = resolve_config(
        experiment, overrides, flags, profile=profile, use_profile=not no_profile
    )
    options = SubmitOptions(
        command=trailing_command(),
        after=after,
        dry_run=dry_run or explain,
        explain=explain,
        local=local,
        code=code,
        snapshot=not no_snapshot,
    )
    result = do_submit(resolved, options)
    if options.dry_run:
        sys.stdout.write(result.script.text)
        return
    for message in result.notes:
        note(f"note: {message}")
    console = out()
    console.print(f"submitted job {result.job_id}", markup=False)
    console.print(f"  run folder: {result.run_dir}", markup=False)
    if result.run_id:
        console.print(f"  MLflow run: {result.run_id}", markup=False)
    if result.run_link:
        console.print(f"  view:       {result.run_link}", markup=False)
    console.print(
        f"  follow:     stoker status {result.job_id}; stoker logs {result.job_id} -f", markup=False
    )
    if as_json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
