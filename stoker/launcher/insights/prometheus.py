"""`stoker insights --prometheus FILE`: the report's totals in Prometheus' text
exposition format, for node_exporter's textfile collector (the operator points
`--collector.textfile.directory` at the folder and runs `stoker insights` from cron).

Gauges only (a window's sums, not counters that only go up), each with HELP and TYPE,
labels escaped as the format asks. The file is written whole and renamed into place,
so the collector never reads half of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from stoker.atomic_write import write_text_atomic
from stoker.job_time import CAUSES
from stoker.launcher.insights.report import Report

PREFIX = "stoker_insights"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return "{" + ",".join(f'{k}="{_label(v)}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    return repr(float(value))


def lines(report: Report) -> Iterator[str]:
    def gauge(
        name: str, help_text: str, samples: list[tuple[dict[str, str], float]]
    ) -> Iterator[str]:
        yield f"# HELP {PREFIX}_{name} {help_text}"
        yield f"# TYPE {PREFIX}_{name} gauge"
        for labels, value in samples:
            yield f"{PREFIX}_{name}{_labels(**labels)} {_number(value)}"

    totals = sorted(report.totals.items())
    yield from gauge(
        "jobs", "Jobs that ended in the window.", [({"resource": r}, t.jobs) for r, t in totals]
    )
    yield from gauge(
        "allocated_seconds",
        "Resource-seconds (GPU or CPU) allocated to the jobs.",
        [({"resource": r}, t.allocated_h * 3600) for r, t in totals],
    )
    yield from gauge(
        "productive_seconds",
        "Resource-seconds spent in training steps that were kept.",
        [({"resource": r}, t.productive_h * 3600) for r, t in totals],
    )
    yield from gauge(
        "goodput_ratio",
        "Productive over allocated resource-seconds.",
        [({"resource": r}, t.goodput) for r, t in totals if t.goodput is not None],
    )
    yield from gauge(
        "lost_seconds",
        "Resource-seconds lost, by cause.",
        [({"resource": r, "cause": c}, t.lost_h[c] * 3600) for r, t in totals for c in CAUSES],
    )
    yield from gauge(
        "unaccounted_seconds",
        "Resource-seconds of jobs whose command kept no time account (left out of goodput).",
        [({"resource": r}, t.unaccounted_h * 3600) for r, t in totals],
    )
    yield from gauge(
        "queue_after_requeue_seconds",
        "Wall seconds requeued jobs waited to start again.",
        [({"resource": r}, t.queue_after_requeue_h * 3600) for r, t in totals],
    )
    yield from gauge(
        "failed_jobs",
        "Jobs that did not complete, by stoker why's cause.",
        [({"cause": c}, n) for c, n in sorted(report.failures.items())],
    )
    yield from gauge(
        "node_incidents",
        "Incidents a node was implicated in (nodes in two or more).",
        [({"node": n.node}, n.incidents) for n in report.nodes],
    )
    mfu = report.mfu
    yield f"# HELP {PREFIX}_mfu_ratio Model FLOPs utilisation of the finished jobs."
    yield f"# TYPE {PREFIX}_mfu_ratio summary"
    for quantile, value in (("0.1", mfu.p10), ("0.5", mfu.p50), ("0.9", mfu.p90)):
        if value is not None:
            yield f"{PREFIX}_mfu_ratio{_labels(quantile=quantile)} {_number(value)}"
    yield f"{PREFIX}_mfu_ratio_sum {_number(mfu.total)}"
    yield f"{PREFIX}_mfu_ratio_count {mfu.count}"
    yield from gauge(
        "window_start_seconds",
        "Start of the report's window (Unix time; 0: all).",
        [({}, report.until - report.since if report.since else 0.0)],
    )


def render(report: Report) -> str:
    return "\n".join(lines(report)) + "\n"


def write_prometheus(report: Report, path: Path) -> None:
    write_text_atomic(path, render(report))
