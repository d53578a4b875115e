"""`stoker config show` and `stoker config schema`."""

from __future__ import annotations

from pathlib import Path

import typer

from stoker.cli import job_options as opt

app = typer.Typer(
    help="Inspect experiment configs: resolved values and where they came from.",
    no_args_is_help=True,
)


def split_experiment_args(args: list[str]) -> tuple[Path | None, list[str]]:
    """`[EXP.yaml] [k=v ...]`: the first argument is the file unless it is an override."""
    if args and ("=" not in args[0] or _is_file(args[0])):
        return Path(args[0]), args[1:]
    return None, list(args)


def _is_file(text: str) -> bool:
    # A long override (a sweep axis of 100 values) is no file name: the OS refuses it.
    try:
        return Path(text).is_file()
    except OSError:
        return False


@app.command("show")
def show(
    args: list[str] = typer.Argument(
        None,
        metavar="EXP.yaml KEY=VALUE",
        help="Experiment file (default: the built-in experiment), then overrides.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the resolved config as JSON."),
    profile: Path = typer.Option(
        None, "--profile", help="Site profile to use instead of $STOKER_PROFILE / the default."
    ),
    no_profile: bool = typer.Option(False, "--no-profile", help="Ignore the site profile."),
    nodes: int = opt.NODES,
    ntasks_per_node: int = opt.NTASKS_PER_NODE,
    gpus_per_node: int = opt.GPUS_PER_NODE,
    cpus_per_task: int = opt.CPUS_PER_TASK,
    mem: str = opt.MEM,
    time: str = opt.TIME,
    partition: str = opt.PARTITION,
    name: str = opt.NAME,
) -> None:
    """Print the resolved experiment and where each value came from.

    Sources, lowest precedence first: default, profile, file, override, flag (the job
    flags of `stoker submit` and `sweep`, such as --nodes, shown as they would set them).

    Example: stoker config show examples/tiny.yaml optim.lr=3e-4 train.steps=50 --nodes 2
    """
    from stoker.cli.output import out, print_json
    from stoker.config import resolve_config
    from stoker.launcher.launch.job_flags import JobFlags, command_line

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
    if as_json:
        print_json(resolved.config.model_dump(mode="json", by_alias=True))
        return

    from stoker.config.render import yaml_scalar

    console = out()
    rows = list(resolved.rows())
    if console.is_terminal:
        from rich.table import Table

        table = Table(show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("key", no_wrap=True)
        table.add_column("value", overflow="fold")
        table.add_column("source", style="cyan", overflow="fold")
        table.add_column("description", style="dim", ratio=1)
        for row in rows:
            source = str(row.source)
            style = "dim" if row.source.kind == "default" else None
            table.add_row(row.key, yaml_scalar(row.value), source, row.description, style=style)
        console.print(table)
        return
    width = max(len(r.key) for r in rows)
    value_width = min(max(len(yaml_scalar(r.value)) for r in rows), 40)
    for row in rows:
        value = yaml_scalar(row.value)
        console.print(f"{row.key:<{width}}  {value:<{value_width}}  # {row.source}", markup=False)


@app.command("schema")
def schema(
    as_json: bool = typer.Option(False, "--json", help="Print the JSON Schema instead."),
) -> None:
    """Print every experiment key with its type, default and description (Markdown).

    docs/config.md is this output.
    """
    import sys

    from stoker.cli.output import print_json

    if as_json:
        from stoker.config import ExperimentConfig

        print_json(ExperimentConfig.model_json_schema(by_alias=True))
        return
    from stoker.config.render import render_config_reference

    sys.stdout.write(render_config_reference())
