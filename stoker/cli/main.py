"""The `stoker` command. Command modules import only typer at module level:
`stoker --help` must stay fast on a login node (see tests/test_cli_imports.py)."""

from __future__ import annotations

import sys

import typer

from stoker.cli import bench as bench_cmd
from stoker.cli import check as check_cmd
from stoker.cli import ckpt as ckpt_cmd
from stoker.cli import config as config_cmd
from stoker.cli import control as control_cmd
from stoker.cli import data as data_cmd
from stoker.cli import doctor as doctor_cmd
from stoker.cli import init as init_cmd
from stoker.cli import insights as insights_cmd
from stoker.cli import logs as logs_cmd
from stoker.cli import plan as plan_cmd
from stoker.cli import run as run_cmd
from stoker.cli import sample as sample_cmd
from stoker.cli import status as status_cmd
from stoker.cli import submit as submit_cmd
from stoker.cli import sweep as sweep_cmd
from stoker.cli import ui as ui_cmd
from stoker.cli import why as why_cmd
from stoker.version import __version__

app = typer.Typer(
    name="stoker",
    help="Train generative video and audio models on SLURM: experiment file in, job out.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    # Plain help: typer's rich help imports rich.markdown and markdown_it (~50 ms
    # measured here), half the start-up budget of `stoker --help`.
    rich_markup_mode=None,
    # StokerError is reported by main(); anything else is a bug and gets a plain
    # traceback without importing rich.traceback at start-up.
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"stoker {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False,
        "--version",
        "-V",
        help="Print the version and exit.",
        callback=_version,
        is_eager=True,
    ),
) -> None:
    """Train generative video and audio models on SLURM: experiment file in, job out."""


# In the order of a user's day: write, check, submit, watch, diagnose, control, probe.
app.command("init")(init_cmd.init)
app.command("run")(run_cmd.run)
app.command("check")(check_cmd.check)
app.command("plan")(plan_cmd.plan)
app.add_typer(config_cmd.app, name="config")
app.command("submit")(submit_cmd.submit)
app.command("sweep")(sweep_cmd.sweep)
app.command("status")(status_cmd.status)
app.command("logs")(logs_cmd.logs)
app.command("why")(why_cmd.why)
app.command("ui")(ui_cmd.ui)
app.command("cancel")(control_cmd.cancel)
app.command("requeue")(control_cmd.requeue)
app.add_typer(data_cmd.app, name="data")
app.add_typer(bench_cmd.app, name="bench")
app.add_typer(ckpt_cmd.app, name="ckpt")
app.command("sample")(sample_cmd.sample)
app.command("insights")(insights_cmd.insights)
app.command("doctor")(doctor_cmd.doctor)


def main() -> None:
    """Console entry point: user errors become one message on stderr and exit code 2."""
    from stoker.cli.trailing import split_argv
    from stoker.errors import StokerError

    try:
        # The name usage lines show: "stoker" however it was started (the console
        # script, `python -m stoker`, or in a test's process: tests/clirun.py).
        app(args=split_argv(sys.argv[1:]), prog_name="stoker")
    except StokerError as exc:
        from stoker.cli.output import print_error

        print_error(exc)
        sys.exit(exc.exit_code)
