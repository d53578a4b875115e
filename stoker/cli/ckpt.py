"""`stoker ckpt`: list, verify, export and prune checkpoints. One module per command."""

from __future__ import annotations

import typer

from stoker.cli import ckpt_export, ckpt_ls, ckpt_prune, ckpt_verify

app = typer.Typer(
    help="Checkpoints: list, verify against COMMIT.json, export weights, prune old ones.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.command("ls")(ckpt_ls.ls)
app.command("verify")(ckpt_verify.verify)
app.command("export")(ckpt_export.export)
app.command("prune")(ckpt_prune.prune)
