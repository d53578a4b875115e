"""`stoker why`: the cause of a job's end (or wait), its evidence, and the fix."""

from __future__ import annotations

import typer


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
    from stoker.launcher.targets import resolve_job
    from stoker.launcher.why import diagnose

    diagnosis = diagnose(resolve_job(job_id, command="why"))
    if as_json:
        print_json(diagnosis.to_json())
        return
    console = out()
    style = "green" if diagnosis.cause == "completed" else "bold red"
    if diagnosis.cause in {"pending", "running", "cancelled"}:
        style = "yellow"
    from rich.text import Text

    headline = Text(f"job {diagnosis.job_id} {diagnosis.state}: ")
    headline.append(diagnosis.summary, style=style if console.is_terminal else "")
    console.print(headline)
    if diagnosis.evidence:
        console.print("evidence:", markup=False)
        for line in diagnosis.evidence:
            console.print(f"  {line}", markup=False, highlight=False)
    if diagnosis.fix:
        console.print(f"fix: {diagnosis.fix}", markup=False)
