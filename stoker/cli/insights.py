"""`stoker insights`: where the cluster hours of your jobs went, across jobs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from stoker.cli.output import Section
    from stoker.launcher.insights.report import Report, Totals


def insights(
    since: str = typer.Option(
        "7d", "--since", help="Jobs submitted in this window: 90s, 30m, 12h, 7d, 2w; 'all'."
    ),
    all_users: bool = typer.Option(
        False,
        "--all-users",
        help="Every user's jobs in this ledger (a STOKER_HOME the team shares).",
    ),
    partition: str | None = typer.Option(None, "--partition", "-p", help="Only this partition."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON document."),
    per_job: bool = typer.Option(
        False, "--per-job", help="With --json: every job's account too (`jobs`)."
    ),
    html: Path | None = typer.Option(
        None, "--html", help="Also write a self-contained HTML report with charts here."
    ),
    prometheus: Path | None = typer.Option(
        None,
        "--prometheus",
        help="Also write the totals in Prometheus' text format here "
        "(for node_exporter's textfile collector: a .prom file in its folder).",
    ),
) -> None:
    """Goodput, the hours lost by cause, failure classes and failing nodes over your jobs.

    Each job that ended has an account: the GPU-hours (CPU-hours for CPU jobs) it was
    allocated, those spent in steps that were kept (productive), and the rest by
    cause: start-up, data wait, checkpoint saves, sampling, steps redone after a
    resume, hangs until detected, time after the last kept step; and the queue
    between a requeue and the next start. Nodes named in two or more incidents (a
    node down, a hang, a killed task, a node failure, repeated straggling) are listed
    with the profile's `exclude:` for users and the `scontrol` drain for operators.

    Example: stoker insights --since 7d --html report.html
    """
    from stoker.cli.output import note, print_json, print_sections
    from stoker.launcher.insights.report import collect, parse_since
    from stoker.launcher.jobs.ledger import Ledger

    window = None if since.strip().lower() == "all" else parse_since(since)
    report, notes = collect(Ledger(), since=window, all_users=all_users, partition=partition)
    for message in notes:
        note(f"note: {message}")
    if html is not None:
        from stoker.launcher.insights.html import write_html

        write_html(report, html)
        note(f"wrote {html}")
    if prometheus is not None:
        from stoker.launcher.insights.prometheus import write_prometheus

        write_prometheus(report, prometheus)
        note(f"wrote {prometheus}")
    if as_json:
        print_json(report.to_json(per_job=per_job))
        return
    if not report.accounts:
        note("no ended jobs in this window; `--since all` looks at every job in the ledger")
        return
    print_sections(_sections(report))


def _hours(value: float) -> str:
    return f"{value:.3g}" if value < 1000 else f"{value:.0f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _totals_row(name: list[str], totals: Totals) -> list[str]:
    lost = sorted(totals.lost_h.items(), key=lambda item: -item[1])
    top = ", ".join(f"{cause} {_hours(hours)}" for cause, hours in lost[:3] if hours > 0)
    return [
        *name,
        str(totals.jobs),
        _hours(totals.allocated_h),
        _hours(totals.productive_h),
        _percent(totals.goodput),
        top or "-",
        str(totals.failed_jobs),
    ]


def _sections(report: Report) -> list[Section]:
    from stoker.job_time import CAUSES

    head = ["JOBS", "HOURS", "PRODUCTIVE", "GOODPUT", "MOST LOST", "FAILED"]
    sections: list[Section] = []
    rows = [_totals_row([r], t) for r, t in sorted(report.totals.items())]
    sections.append(("Totals (resource-hours)", ["RESOURCE", *head], rows))
    lost_rows = []
    for resource, totals in sorted(report.totals.items()):
        for cause in CAUSES:
            if totals.lost_h[cause] > 0:
                share = totals.lost_h[cause] / totals.allocated_h if totals.allocated_h else 0
                lost_rows.append([resource, cause, _hours(totals.lost_h[cause]), _percent(share)])
        if totals.unaccounted_h > 0:
            lost_rows.append(
                [resource, "not accounted (own commands)", _hours(totals.unaccounted_h), "-"]
            )
        if totals.queue_after_requeue_h > 0:
            lost_rows.append(
                [resource, "queue after requeue (wall)", _hours(totals.queue_after_requeue_h), "-"]
            )
    sections.append(("Lost hours by cause", ["RESOURCE", "CAUSE", "HOURS", "SHARE"], lost_rows))
    for title, table, column in (
        ("By user", report.by_user, "USER"),
        ("By partition", report.by_partition, "PARTITION"),
        ("By experiment", report.by_experiment, "EXPERIMENT"),
    ):
        rows = [_totals_row([key, resource], t) for (key, resource), t in sorted(table.items())]
        sections.append((title, [column, "RESOURCE", *head], rows))
    failures = sorted(report.failures.items(), key=lambda item: -item[1])
    sections.append(
        (
            "Failures by class (stoker why)",
            ["CAUSE", "JOBS", "HOURS"],
            [[c, str(n), _hours(report.failure_hours[c])] for c, n in failures],
        )
    )
    node_rows = []
    for node in report.nodes:
        users, operators = node.advice()
        kinds = ", ".join(f"{kind} x{count}" for kind, count in sorted(node.kinds.items()))
        node_rows.append(
            [
                node.node,
                str(node.incidents),
                kinds,
                ", ".join(node.jobs[:6]),
                f"{users}; operators: {operators}",
            ]
        )
    sections.append(
        (
            "Nodes in two or more incidents",
            ["NODE", "INCIDENTS", "WHAT", "JOBS", "WHAT TO DO"],
            node_rows,
        )
    )
    mfu, speed = report.mfu, report.samples_per_s
    sections.append(
        (
            "Finished jobs: MFU and throughput per rank",
            ["", "JOBS", "P10", "P50", "P90"],
            [
                ["MFU", str(mfu.count), _percent(mfu.p10), _percent(mfu.p50), _percent(mfu.p90)],
                [
                    "samples/s",
                    str(speed.count),
                    *(
                        f"{v:.3g}" if v is not None else "-"
                        for v in (speed.p10, speed.p50, speed.p90)
                    ),
                ],
            ],
        )
    )
    return sections
