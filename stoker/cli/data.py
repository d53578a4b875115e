"""`stoker data`: write, pack, inspect and benchmark AV data sets. One module per command,
listed in stoker/cli/command_table.py and imported when it runs."""

from __future__ import annotations

import typer

from stoker.cli.lazy_group import LazyGroup

app = typer.Typer(
    cls=LazyGroup,
    help="AV data sets: synthesize, pack media into shards, encode latents, inspect, "
    "benchmark the loader.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
