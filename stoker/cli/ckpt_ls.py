"""`stoker ckpt ls`: the step-<N> folders under a checkpoint root."""

from __future__ import annotations

import typer


def ls(
    path: str = typer.Argument(
        ..., metavar="PATH", help="Checkpoint root (folder, s3://, ...), or a job id: its root."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the rows as a JSON list."),
) -> None:
    """Every step-<N> folder under PATH, newest first: step, committed, bytes, path.

    A folder is committed when its COMMIT.json is present and readable; bytes
    are the committed files' total, or what is there for an uncommitted folder.
    Folders not named step-<N> are not listed.

    Example: stoker ckpt ls s3://bucket/runs/exp1/checkpoints --json
    """
    from stoker.checkpoint.commit import exists, list_checkpoints
    from stoker.cli.ckpt_root import checkpoint_path
    from stoker.cli.output import print_json
    from stoker.errors import StokerError

    path = checkpoint_path(path)

    if not exists(path):
        raise StokerError(
            f"no checkpoint root at {path!r}: the path does not exist",
            fix="pass the run's checkpoint root "
            "(checkpoint.root, default <run folder>/checkpoints)",
        )
    rows = list_checkpoints(path)
    if as_json:
        print_json([row.to_dict() for row in rows])
        return
    # Plain columns, path last and never cut: long s3:// URLs stay copyable.
    typer.echo(f"{'step':>10}  {'committed':9}  {'bytes':>14}  path")
    for row in rows:
        committed = "yes" if row.committed else "no"
        typer.echo(f"{row.step:>10}  {committed:9}  {row.bytes:>14}  {row.path}")
