"""`stoker ckpt prune`: apply the retention rules to a checkpoint root by hand."""

from __future__ import annotations

import typer

from stoker.plural import plural


def prune(
    path: str = typer.Argument(
        ..., metavar="PATH", help="Checkpoint root (folder, s3://, ...), or a job id: its root."
    ),
    keep_last: int = typer.Option(
        ..., "--keep-last", min=1, help="Keep the newest this many verified checkpoints."
    ),
    keep_every: int | None = typer.Option(
        None, "--keep-every", min=1, help="Also keep every checkpoint whose step is a multiple."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Say what would go; delete nothing."),
    as_json: bool = typer.Option(False, "--json", help="Print every decision as JSON."),
) -> None:
    """Delete old checkpoints under PATH: all but the newest --keep-last verified
    ones and the multiples of --keep-every, as a running job does after each save.

    Safe by construction: nothing is deleted until a checkpoint verifies (sizes
    against COMMIT.json), the newest verified one and anything newer (a save in
    progress, a broken commit to look at) are kept, and folders stoker did not
    write are never touched. A save that never committed and is older than the
    newest verified one is deleted.

    Example: stoker ckpt prune s3://bucket/runs/exp1/checkpoints --keep-last 2 --keep-every 1000
    """
    from stoker.checkpoint.commit import exists
    from stoker.checkpoint.retention import prune as apply_rules
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
    decisions = apply_rules(path, keep_last=keep_last, keep_every=keep_every, dry_run=dry_run)
    if as_json:
        print_json(
            [
                {**d.row.to_dict(), "delete": d.delete, "reason": d.reason, "dry_run": dry_run}
                for d in decisions
            ]
        )
        return
    verb = "would delete" if dry_run else "deleted"
    for d in decisions:
        typer.echo(f"{verb if d.delete else 'kept':12}  step-{d.row.step:<8}  {d.reason}")
    gone = [d for d in decisions if d.delete]
    freed = sum(d.row.bytes for d in gone)
    typer.echo(
        f"{verb} {len(gone)} of {plural(len(decisions), 'checkpoint')}: {plural(freed, 'byte')}"
    )
