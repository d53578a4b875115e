"""The `stoker` command's typer app. Its commands are listed in
stoker/cli/command_table.py and imported when used; their modules import only typer at
module level: `stoker --help` must stay fast on a login node (see
tests/test_cli_imports.py). The console entry point is stoker/cli/main.py, which prints a
help it has kept without importing this module (stoker/cli/help_cache.py)."""

from __future__ import annotations

import sys

import typer

from stoker.cli.help_cache import HelpCache
from stoker.cli.lazy_group import LazyGroup
from stoker.version import __version__

app = typer.Typer(
    name="stoker",
    # The commands of stoker/cli/command_table.py, each imported and built when it runs
    # or shows its help: `stoker --help` imports none of their modules.
    cls=LazyGroup,
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


def run(argv: list[str], kept_help: HelpCache | None = None) -> None:
    """`stoker ARGV`: user errors become one message on stderr and exit code 2. With
    `kept_help`, what a help request prints is also kept there when it exits 0."""
    from stoker.cli.trailing import split_argv
    from stoker.errors import StokerError

    try:
        # The name usage lines show: "stoker" however it was started (the console
        # script, `python -m stoker`, or in a test's process: tests/clirun.py).
        if kept_help is None:
            app(args=split_argv(argv), prog_name="stoker")
        else:
            _print_and_keep_help(split_argv(argv), kept_help)
    except StokerError as exc:
        from stoker.cli.output import print_error

        print_error(exc)
        sys.exit(exc.exit_code)


def _print_and_keep_help(argv: list[str], kept_help: HelpCache) -> None:
    import contextlib
    import io

    printed = io.StringIO()
    status: str | int | None = 0
    try:
        # click formats for the terminal's width (sys.__stdout__), not for this buffer.
        with contextlib.redirect_stdout(printed):
            app(args=argv, prog_name="stoker")
    except SystemExit as exc:
        status = exc.code
    finally:
        sys.stdout.write(printed.getvalue())
    if status in (0, None):
        kept_help.keep(printed.getvalue())
    sys.exit(status)
