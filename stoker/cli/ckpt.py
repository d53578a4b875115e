"""`stoker ckpt`: list, verify, export and prune checkpoints. One module per command,
listed in stoker/cli/command_table.py and imported when it runs."""

from __future__ import annotations

import typer

from stoker.cli.lazy_group import LazyGroup

app = typer.Typer(
    cls=LazyGroup,
    help="Checkpoints: list, verify against COMMIT.json, export weights, prune old ones.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
