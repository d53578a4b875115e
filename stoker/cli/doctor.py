"""`stoker doctor`: check SLURM, MLflow, storage, GPUs and NCCL from this machine."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from stoker.launcher.doctor import Finding


def doctor(
    as_json: bool = typer.Option(
        False, "--json", help='Print a JSON list of {"check", "status", "detail", "fix"}.'
    ),
) -> None:
    """Check that jobs can be submitted from here and will run: SLURM (version,
    controller, partitions, GRES, accounting, requeue, containers), the MLflow store,
    the run folder, GPUs and NCCL variables.

    Each line is ok, warn or fail, with the fix when not ok. Exit code 1 when a
    check failed; warnings keep 0.

    Example: stoker doctor --json | jq '.[] | select(.status != "ok")'
    """
    from stoker.cli.output import note, print_json
    from stoker.launcher.doctor import run_checks

    findings = run_checks()
    if as_json:
        print_json([f.as_dict() for f in findings])
    else:
        print_findings(findings)
    failed = sum(f.status == "fail" for f in findings)
    warned = sum(f.status == "warn" for f in findings)
    note(f"{len(findings)} checks: {failed} failed, {warned} warnings")
    if failed:
        raise typer.Exit(1)


STATUS_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def print_findings(findings: list[Finding]) -> None:
    """A table on a terminal; piped, one `status  check  detail  fix: ...` line each."""
    from stoker.cli.output import out

    console = out()
    if console.is_terminal:
        from rich.table import Table
        from rich.text import Text

        table = Table(show_edge=False, pad_edge=False, header_style="bold")
        table.add_column("", no_wrap=True)
        table.add_column("check", no_wrap=True)
        table.add_column("finding", ratio=2, overflow="fold")
        table.add_column("fix", ratio=1, overflow="fold", style="cyan")
        for f in findings:
            # Text, not markup: details quote SLURM output such as `SlurmctldHost[0]`.
            table.add_row(
                Text(f.status, style=STATUS_STYLE[f.status]),
                Text(f.check),
                Text(f.detail),
                Text(f.fix or ""),
            )
        console.print(table)
        return
    width = max(len(f.check) for f in findings)
    for f in findings:
        fix = f"  fix: {f.fix}" if f.fix else ""
        console.print(f"{f.status:<5} {f.check:<{width}}  {f.detail}{fix}", markup=False)
