"""`stoker submit`: validate, snapshot, pre-create the MLflow run, render, check, submit."""

from __future__ import annotations

from pathlib import Path

import typer

from stoker.cli import job_options as opt
from stoker.cli.config import split_experiment_args


def submit(
    args: list[str] = typer.Argument(
        None,
        metavar="[EXP.yaml] [KEY=VALUE ...] [-- CMD ...]",
        help="Experiment file (default: the built-in experiment), overrides, and after `--` "
        "the command each task runs (default: the training runtime).",
    ),
    nodes: int = opt.NODES,
    ntasks_per_node: int = opt.NTASKS_PER_NODE,
    gpus_per_node: int = opt.GPUS_PER_NODE,
    cpus_per_task: int = opt.CPUS_PER_TASK,
    mem: str = opt.MEM,
    time: str = opt.TIME,
    partition: str = opt.PARTITION,
    name: str = opt.NAME,
    after: str = opt.AFTER,
    dry_run: bool = opt.DRY_RUN,
    explain: bool = opt.EXPLAIN,
    local: bool = typer.Option(
        False, "--local", help="Run the same launch as local processes, without SLURM."
    ),
    code: Path = opt.CODE,
    no_snapshot: bool = opt.NO_SNAPSHOT,
    no_check: bool = opt.NO_CHECK,
    as_json: bool = typer.Option(
        False, "--json", help='Print {"job_id", "run_id", "run_dir"} as the last line.'
    ),
    profile: Path = opt.PROFILE,
    no_profile: bool = opt.NO_PROFILE,
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
    from stoker.launcher.launch.job_flags import JobFlags, command_line
    from stoker.launcher.launch.submit import SubmitOptions
    from stoker.launcher.launch.submit import submit as do_submit

    experiment, overrides = split_experiment_args(args or [])
    flags = JobFlags(
        nodes=nodes,
        ntasks_per_node=ntasks_per_node,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        mem=mem,
        time=time,
        partition=partition,
        name=name,
    ).for_config(command_line)
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
        check=not no_check,
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
