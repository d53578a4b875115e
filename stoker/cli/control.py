"""`stoker cancel` and `stoker requeue`."""

from __future__ import annotations

import typer


def cancel(
    job_ids: list[str] = typer.Argument(..., metavar="JOB...", help="Job ids (123 or 123_4)."),
) -> None:
    """Cancel jobs stoker submitted (SLURM or --local)."""
    from stoker.cli.output import out
    from stoker.launcher.control import cancel as do_cancel

    for job_id in job_ids:
        out().print(do_cancel(job_id), markup=False)


def requeue(
    job_ids: list[str] = typer.Argument(..., metavar="JOB...", help="Job ids (123 or 123_4)."),
    hold: bool = typer.Option(False, "--hold", help="Requeue and hold until released."),
) -> None:
    """Requeue jobs: they stop and start again, resuming from their last checkpoint."""
    from stoker.cli.output import out
    from stoker.launcher.control import requeue as do_requeue

    for job_id in job_ids:
        out().print(do_requeue(job_id, hold=hold), markup=False)
