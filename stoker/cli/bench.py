"""`stoker bench`: benchmarks with roofline figures. One module per command, listed in
stoker/cli/command_table.py and imported when it runs."""

from __future__ import annotations

import typer

from stoker.cli.lazy_group import LazyGroup

app = typer.Typer(
    cls=LazyGroup,
    help="Benchmarks: Triton kernels against torch eager, torch.compile and Liger-Kernel.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
