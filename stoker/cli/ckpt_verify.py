"""`stoker ckpt verify`: check checkpoints against their COMMIT.json."""

from __future__ import annotations

import typer


def verify(
    path: str = typer.Argument(
        ...,
        metavar="PATH",
        help="One checkpoint folder (step-<N>) or a checkpoint root, or a job id: its root.",
    ),
    sizes_only: bool = typer.Option(
        False,
        "--sizes-only",
        help="Only check that each file exists with its size (fast; misses changed bytes).",
    ),
    full: bool = typer.Option(
        True, "--full", hidden=True, help="Every file's sha256: the default (kept for scripts)."
    ),
) -> None:
    """Check every file listed in COMMIT.json: it exists, with its size and sha256.

    Reads every byte, as a resuming job does (checkpoint.verify: full); --sizes-only
    checks sizes alone, which misses a flipped byte. PATH is one step-<N> folder, or
    a root: then every committed checkpoint under it. Exit 0 when all verify, 1
    naming each file that does not.

    Example: stoker ckpt verify /scratch/runs/exp1/checkpoints/step-2000
    """
    from stoker.checkpoint.commit import exists, list_checkpoints, step_of
    from stoker.checkpoint.commit import verify as verify_folder
    from stoker.cli.ckpt_root import checkpoint_path
    from stoker.cli.output import note
    from stoker.errors import StokerError

    path = checkpoint_path(path)

    if not exists(path):
        raise StokerError(
            f"no checkpoint at {path!r}: the path does not exist",
            fix="pass a step-<N> folder or the run's checkpoint root",
        )
    if step_of(path) is not None:
        folders = [path]
    else:
        folders = [row.path for row in list_checkpoints(path) if row.committed]
        if not folders:
            note(f"no committed checkpoint under {path}")
            raise typer.Exit(1)
    failed = False
    for folder in folders:
        problems = verify_folder(folder, full=not sizes_only)
        failed = failed or bool(problems)
        if not problems:
            typer.echo(f"ok      {folder}")
        for problem in problems:
            typer.echo(f"FAILED  {folder}: {problem}")
    raise typer.Exit(1 if failed else 0)
