"""`stoker logs`: merged per-rank logs of a job, followed across requeues."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from stoker.launcher.jobs.targets import Target


def logs(
    job_id: str = typer.Argument(
        ..., metavar="JOB", help="Ledger job id: '123', or '123_4' for task 4 of a job array."
    ),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Keep printing new lines, across requeues, until the job has ended (Ctrl-C stops).",
    ),
    rank: int | None = typer.Option(
        None,
        "--rank",
        "-r",
        min=0,
        metavar="N",
        help="Only this rank's lines (and no batch.log lines).",
    ),
    grep: str | None = typer.Option(
        None, "--grep", "-g", metavar="REGEX", help="Only lines matching this Python regex."
    ),
    tail: int | None = typer.Option(
        None,
        "--tail",
        "-n",
        min=0,
        metavar="N",
        help="Only the last N lines of each rank (per restart).",
    ),
    restart: str = typer.Option(
        "all",
        "--restart",
        metavar="R|last|all",
        help="Which start of the job: 0 is the first, 1 after the first requeue.",
    ),
    batch: bool = typer.Option(
        True, "--batch/--no-batch", help="Show batch.log lines (srun and slurmstepd messages)."
    ),
) -> None:
    """Print the logs of every rank of a job, each line prefixed with its rank.

    The files have no time stamps: a finished job prints restart by restart, rank by
    rank, then the restart's batch.log lines ([batch]: srun's and slurmstepd's
    messages); `-f` then prints new lines as they arrive.

    Examples: stoker logs 123 --rank 0 --tail 20 ; stoker logs 123 -f --grep 'loss|Error'
    """
    import sys

    from stoker.cli.output import note
    from stoker.launcher.jobs.targets import resolve_job
    from stoker.launcher.watch.logs import (
        LogFilter,
        LogReader,
        compile_grep,
        job_state,
        parse_restart,
    )
    from stoker.launcher.watch.logs import (
        follow as follow_logs,
    )

    target = resolve_job(job_id)
    log_filter = LogFilter(
        rank=rank,
        pattern=compile_grep(grep) if grep is not None else None,
        tail=tail,
        restart=parse_restart(restart),
        batch=batch and rank is None,
    )

    def write(line: str) -> None:
        sys.stdout.write(line + "\n")
        if follow:
            sys.stdout.flush()

    reader = LogReader(target.run, log_filter, write)
    try:
        if not reader.has_output():
            state = job_state(target)
            reason = f" ({state.reason})" if state.reason else ""
            if state.ended:
                note(f"job {target.job_id} ended ({state.state}) without writing any log")
                return
            if state.state == "PENDING":
                note(f"job {target.job_id} is pending{reason}: no logs yet")
            else:
                note(f"job {target.job_id} is {state.state.lower()}{reason}: no logs yet")
            if not follow:
                note(f"`stoker logs -f {target.job_id}` waits for them")
                return
        reader.check_selection()
        if follow:
            follow_logs(reader, lambda: job_state(target).ended)
            sys.stdout.flush()
            _say_how_it_ended(target)
        else:
            reader.snapshot(final=True)
        sys.stdout.flush()
    except KeyboardInterrupt:
        pass  # Ctrl-C is the way out of -f: exit 0, no traceback
    except BrokenPipeError:
        # `stoker logs ... | head`: the reader has gone; stop quietly.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _say_how_it_ended(target: Target) -> None:
    """After following a job to its end: why it failed, as `stoker why` says it (the
    first failing rank may not be the one followed); its MLflow run ended."""
    from stoker.cli.output import err
    from stoker.cli.why import print_diagnosis
    from stoker.launcher.jobs.ledger import Ledger
    from stoker.launcher.watch.job_end import Ended, settle
    from stoker.launcher.why import diagnose

    diagnosis = diagnose(target)
    settle(Ledger(), [Ended(target, diagnosis.state)], {target.job_id: diagnosis})
    if diagnosis.cause != "completed":
        print_diagnosis(diagnosis, err())
