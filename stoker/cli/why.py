"""`stoker why`: the cause of a job's end (or wait), its evidence, and the fix."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from stoker.launcher.why import Diagnosis


def why(
    job_id: str = typer.Argument(
        ..., metavar="JOB", help="Ledger job id: '123', or '123_4' for task 4 of a job array."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print {"job_id", "state", "cause", "summary", "evidence", "fix", '
        '"failing_rank", "exit_code"}.',
    ),
) -> None:
    """Say why a job failed, timed out, hung, ran out of memory, was cancelled or is
    still pending: the cause in one line, the evidence, and the fix.

    Reads SLURM (one scontrol and one sacct call), the batch log, the first failing
    rank's traceback and known signatures (GPU/host OOM, NCCL, rendezvous).

    Example: stoker why 123 --json | jq -r .cause
    """
    from stoker.cli.output import out, print_json
    from stoker.launcher.jobs.targets import resolve_job
    from stoker.launcher.why import diagnose

    target = resolve_job(job_id, command="why")
    diagnosis = diagnose(target)
    from stoker.launcher.jobs.ledger import Ledger
    from stoker.launcher.watch.job_end import Ended, settle

    # What `stoker status` would do on seeing the end: keep the reason, end the MLflow run.
    settle(Ledger(), [Ended(target, diagnosis.state)], {target.job_id: diagnosis})
    if as_json:
        print_json(diagnosis.to_json())
        return
    print_diagnosis(diagnosis, out())


def print_diagnosis(diagnosis: Diagnosis, console: Console) -> None:
    """The headline, the evidence and the fix, as `stoker why` prints them (and
    `stoker run` after a failed job)."""
    from rich.text import Text

    style = "green" if diagnosis.cause == "completed" else "bold red"
    if diagnosis.cause in {"pending", "running", "cancelled"}:
        style = "yellow"
    headline = Text(f"job {diagnosis.job_id} {diagnosis.state}: ")
    headline.append(diagnosis.summary, style=style if console.is_terminal else "")
    console.print(headline)
    if diagnosis.evidence:
        console.print("evidence:", markup=False)
        for line in diagnosis.evidence:
            console.print(f"  {line}", markup=False, highlight=False)
    if diagnosis.fix:
        console.print(f"fix: {diagnosis.fix}", markup=False)
