"""`stoker status`: one table of your jobs from one batched squeue/sacct query."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from stoker.protocol import STRAGGLER_RATIO

if TYPE_CHECKING:
    from collections.abc import Callable

    from rich.table import Table

    from stoker.launcher.watch.status import JobStatus

COLUMNS = (
    "JOB",
    "NAME",
    "STATE",
    "REASON",
    "NODES",
    "ELAPSED",
    "RESTARTS",
    "STEP",
    "LOSS",
    "THROUGHPUT",
    "ETA",
    "STRAGGLER",
    "MLFLOW RUN",
)
_STATE_STYLE = {
    "RUNNING": "green",
    "COMPLETING": "green",
    "CONFIGURING": "green",
    "PENDING": "yellow",
    "REQUEUED": "yellow",
    "SUSPENDED": "yellow",
    "COMPLETED": "blue",
    "CANCELLED": "magenta",
    "UNKNOWN": "dim",
}
_BAD_STATES = {"FAILED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED"}


def status(
    jobs: list[str] = typer.Argument(
        None,
        metavar="[JOB]...",
        help="Ledger job ids: '123' (an array job shows all its tasks) or '123_4'. "
        "Default: active jobs and those that ended in the last 24 h.",
        show_default=False,
    ),
    all_jobs: bool = typer.Option(False, "--all", "-a", help="Show every job in the ledger."),
    watch: bool = typer.Option(
        False, "--watch", "-w", help="Keep the table on screen, refreshed, until Ctrl-C."
    ),
    interval: float = typer.Option(
        2.0, "--interval", min=0.5, help="Seconds between refreshes with --watch."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of jobs."),
) -> None:
    """Show state, nodes, elapsed time, restarts, progress and MLflow run of your jobs.

    One refresh asks SLURM once (one squeue and one sacct call for all jobs);
    jobs already seen to end are answered from the ledger. STRAGGLER names a rank
    whose own time per step (data wait + forward compute) was over {ratio}x the median
    rank's in the last log window: r3@node7 1.45x data (its loader) or compute
    (its GPU or node).

    Example: stoker status --watch
    """
    from stoker.cli.output import note, out, print_json
    from stoker.errors import StokerError
    from stoker.launcher.jobs.ledger import Ledger
    from stoker.launcher.jobs.targets import select_jobs
    from stoker.launcher.watch.status import collect_status

    if watch and as_json:
        raise StokerError(
            "--watch and --json cannot be combined", fix="use --json alone in scripts"
        )
    if watch and not out().is_terminal:
        raise StokerError(
            "--watch needs a terminal; stdout is not one", fix="use --json in scripts"
        )
    ledger = Ledger()
    seen_notes: set[str] = set()

    def refresh() -> list[JobStatus]:
        targets = select_jobs(ledger, jobs or (), all_jobs=all_jobs)
        report = collect_status(targets, ledger)
        for message in report.notes:
            if message not in seen_notes:
                seen_notes.add(message)
                note(f"note: {message}")
        return report.rows

    if watch:
        _watch(refresh, interval)
        return
    rows = refresh()
    if as_json:
        print_json([row.to_json() for row in rows])
        return
    if not rows:
        note("no active or recent jobs; `stoker status --all` lists every job in the ledger")
        return
    if out().is_terminal:
        out().print(_rich_table(rows))
    else:
        _print_plain(rows)


# The help quotes the ratio the flag uses (stoker/protocol.py: no heavy imports).
status.__doc__ = (status.__doc__ or "").replace("{ratio}", str(STRAGGLER_RATIO))


def _watch(refresh: Callable[[], list[JobStatus]], interval: float) -> None:
    import time

    from rich.live import Live

    from stoker.cli.output import out

    def render() -> Table:
        table = _rich_table(refresh())
        table.caption = f"{time.strftime('%H:%M:%S')}, every {interval:g} s; Ctrl-C to quit"
        return table

    try:
        with Live(render(), console=out(), auto_refresh=False) as live:
            while True:
                time.sleep(interval)
                live.update(render(), refresh=True)
    except KeyboardInterrupt:
        pass  # the way out of --watch: leave the last table on screen, exit 0


def _cells(row: JobStatus) -> list[str]:
    from stoker.launcher.slurm.query import format_elapsed

    nodes = "-"
    if row.nodes is not None or row.node_list:
        nodes = " ".join(str(v) for v in (row.nodes, row.node_list) if v is not None)
    if row.spares:
        nodes += f" (spare {row.spares})"
    step = "-"
    if row.step is not None:
        step = f"{row.step}/{row.total_steps}" if row.total_steps is not None else str(row.step)
    throughput = "-"
    if row.throughput is not None:
        throughput = f"{_si(row.throughput)} {row.throughput_unit}"
    return [
        row.job_id,
        row.name,
        row.state,
        row.reason or "-",
        nodes,
        format_elapsed(row.elapsed_s) if row.elapsed_s is not None else "-",
        str(row.restarts),
        step,
        f"{row.loss:.4g}" if row.loss is not None else "-",
        throughput,
        format_elapsed(row.eta_s) if row.eta_s is not None else "-",
        _straggler(row),
        row.mlflow_run_id or "-",
    ]


def _straggler(row: JobStatus) -> str:
    """The cell of a flagged straggler, `r3@node7 1.45x data`; "-" otherwise."""
    if not row.straggler or row.slowest_ratio is None:
        return "-"
    where = f"r{row.slowest_rank}" if row.slowest_rank is not None else "rank ?"
    if row.slowest_host:
        where += f"@{row.slowest_host}"
    cause = f" {row.straggler_cause}" if row.straggler_cause else ""
    return f"{where} {row.slowest_ratio:.2f}x{cause}"


def _si(value: float) -> str:
    """1234.5 -> "1.23k": throughput spans 10 to 10^7 per second."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def _print_plain(rows: list[JobStatus]) -> None:
    """Aligned columns, no colour, no box: for pipes, grep and awk."""
    import sys

    table = [list(COLUMNS), *(_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    for line in table:
        text = "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        sys.stdout.write(text.rstrip() + "\n")


_ALWAYS_SHOWN = frozenset({"JOB", "NAME", "STATE", "REASON"})
_STATE, _REASON = COLUMNS.index("STATE"), COLUMNS.index("REASON")
_STRAGGLER = COLUMNS.index("STRAGGLER")


def _rich_table(rows: list[JobStatus]) -> Table:
    from rich.table import Table
    from rich.text import Text

    table = Table(show_edge=False, pad_edge=False, header_style="bold")
    states = max((len(row.state) for row in rows), default=0)
    all_cells = [_cells(row) for row in rows]
    # A terminal's width goes to what some job has: a column that is "-" in every row
    # (no job trains yet: STEP, LOSS, ETA...) is left out; a pipe and --json keep all.
    shown = [
        i
        for i, name in enumerate(COLUMNS)
        if name in _ALWAYS_SHOWN or any(cells[i] != "-" for cells in all_cells)
    ]
    for i in shown:
        name = COLUMNS[i]
        numeric = name in {"ELAPSED", "RESTARTS", "STEP", "LOSS", "THROUGHPUT", "ETA"}
        # A row is one line: a long REASON is cut (`stoker why` and --json have it whole),
        # and the state is never cut (`COMPLE…` could be COMPLETED or COMPLETING).
        table.add_column(
            name,
            justify="right" if numeric else "left",
            no_wrap=name in {"JOB", "STATE"},
            min_width=max(states, len(name)) if name == "STATE" else None,
        )
    for row, texts in zip(rows, all_cells, strict=True):
        cells = {i: Text(texts[i]) for i in shown}
        cells[_REASON].no_wrap, cells[_REASON].overflow = True, "ellipsis"
        style = "red" if row.state in _BAD_STATES else _STATE_STYLE.get(row.state, "")
        cells[_STATE].stylize(style)
        if row.straggler and _STRAGGLER in cells:
            cells[_STRAGGLER].stylize("bold red")
        table.add_row(*(cells[i] for i in shown))
    return table
