"""`stoker sweep`: a grid of experiments as one SLURM job array."""

from __future__ import annotations

from pathlib import Path

import typer

from stoker.cli import job_options as opt


def sweep(
    args: list[str] = typer.Argument(
        ...,
        metavar="EXP.yaml KEY=V1,V2 ... [-- CMD ...]",
        help="Experiment file, then sweep axes (KEY=V1,V2,...) and fixed overrides (KEY=V).",
    ),
    max_parallel: int = typer.Option(
        None, "--max-parallel", min=1, help="Run at most this many tasks at once (--array %K)."
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
    code: Path = opt.CODE,
    no_snapshot: bool = opt.NO_SNAPSHOT,
    no_check: bool = opt.NO_CHECK,
    as_json: bool = typer.Option(
        False, "--json", help='Print {"job_id", "run_id", "run_dir", "child_run_ids"} last.'
    ),
    profile: Path = opt.PROFILE,
    no_profile: bool = opt.NO_PROFILE,
) -> None:
    """Submit every combination of the sweep axes as one job array.

    One frozen config and one MLflow child run per task, under one parent run. Values
    split on the commas outside brackets: 'optim.betas=[0.9,0.95],[0.9,0.99]' sweeps two
    lists.

    Example: stoker sweep exp.yaml optim.lr=1e-4,3e-4,1e-3 train.seed=1,2 --max-parallel 2
    """
    import json
    import sys

    from stoker.cli.config import split_experiment_args
    from stoker.cli.output import note, out
    from stoker.cli.trailing import trailing_command
    from stoker.launcher.launch.job_flags import JobFlags, command_line
    from stoker.launcher.launch.submit import SubmitOptions
    from stoker.launcher.launch.sweep import submit_sweep

    experiment, rest = split_experiment_args(args)
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
    options = SubmitOptions(
        command=trailing_command(),
        after=after,
        dry_run=dry_run or explain,
        explain=explain,
        code=code,
        snapshot=not no_snapshot,
        max_parallel=max_parallel,
        check=not no_check,
    )
    plan, result = submit_sweep(
        experiment, rest, flags, options, profile=profile, use_profile=not no_profile
    )
    if options.dry_run:
        sys.stdout.write(result.script.text)
        for index in range(len(plan.tasks)):
            note(f"task {index}: {plan.describe(index)}")
        return
    console = out()
    console.print(f"submitted sweep {result.job_id}: {len(plan.tasks)} tasks", markup=False)
    for index in range(len(plan.tasks)):
        console.print(f"  {result.job_id}_{index}  {plan.describe(index)}", markup=False)
    console.print(f"  run folder: {result.run_dir}", markup=False)
    if result.run_link:
        console.print(f"  parent run: {result.run_id}  view: {result.run_link}", markup=False)
    if as_json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
