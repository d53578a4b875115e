"""`stoker ckpt`: list and verify checkpoints. One module per command."""

from __future__ import annotations

import typer

from stoker.cli import ckpt_ls, ckpt_verify

app = typer.Typer(
    help="Checkpoints: list them, verify them against their COMMIT.json.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.command("ls")(ckpt_ls.ls)
app.command("verify")(ckpt_verify.verify)
