"""`stoker insights --html FILE`: the report as one self-contained HTML file.

No script, no font, no stylesheet from the network: the charts are inline SVG drawn
here (goodput by day, lost hours by cause, failures by class and by node, the MFU
histogram of finished jobs), each bar with a <title> tooltip and each chart with its
numbers in a table beside it, so the file opens anywhere, mailed or archived. Every
value from the ledger is escaped.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from html import escape
from pathlib import Path

from stoker.atomic_write import write_text_atomic
from stoker.job_time import CAUSES
from stoker.launcher.insights.report import MFU_BINS, Report

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; max-width: 1100px }
h1 { font-size: 1.5em } h2 { font-size: 1.15em; margin-top: 2em }
table { border-collapse: collapse; margin: .5em 0 } td, th { padding: 2px 10px;
  border-bottom: 1px solid #ddd; text-align: right } th:first-child, td:first-child
  { text-align: left } .chart { display: flex; gap: 2em; align-items: flex-start;
  flex-wrap: wrap } svg text { font: 11px system-ui, sans-serif; fill: #333 }
.kpi { display: inline-block; margin-right: 2em } .kpi b { font-size: 1.6em; display: block }
code { background: #f4f4f4; padding: 1px 4px }
"""
_COLOURS = ("#4c78a8", "#f58518", "#e45756", "#72b7b2", "#54a24b", "#eeca3b", "#b279a2", "#ff9da6")


def _bars(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    unit: str,
    title: str,
    width: int = 520,
    colour: str = _COLOURS[0],
) -> str:
    """A horizontal bar chart as inline SVG; `data-chart` names it for the browser check."""
    row, left, right = 22, 170, 70
    height = row * max(len(labels), 1) + 10
    top = max(values, default=0.0) or 1.0
    parts = [
        f'<svg class="bars" data-chart="{escape(title)}" role="img" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}"><title>{escape(title)}</title>'
    ]
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        y = 5 + i * row
        length = (width - left - right) * value / top
        text = f"{value:.3g} {unit}"
        parts.append(
            f'<text x="{left - 6}" y="{y + 14}" text-anchor="end">{escape(label)}</text>'
            f'<rect x="{left}" y="{y + 3}" width="{max(length, 0.5):.1f}" height="{row - 6}" '
            f'fill="{colour}"><title>{escape(label)}: {escape(text)}</title></rect>'
            f'<text x="{left + length + 4:.1f}" y="{y + 14}">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _columns(
    labels: Sequence[str],
    series: dict[str, Sequence[float]],
    *,
    title: str,
    width: int = 640,
    height: int = 220,
) -> str:
    """Vertical bars per label, one colour per series, stacked; a legend below."""
    bottom, left = 40, 50
    inner_w, inner_h = width - left - 10, height - bottom - 10
    totals = [sum(values[i] for values in series.values()) for i in range(len(labels))]
    top = max(totals, default=0.0) or 1.0
    step = inner_w / max(len(labels), 1)
    parts = [
        f'<svg class="columns" data-chart="{escape(title)}" role="img" width="{width}" '
        f'height="{height + 20 * ((len(series) + 3) // 4)}"><title>{escape(title)}</title>',
        f'<line x1="{left}" y1="{10 + inner_h}" x2="{width - 10}" y2="{10 + inner_h}" '
        'stroke="#999"/>',
        f'<text x="{left - 4}" y="16" text-anchor="end">{top:.3g}</text>',
    ]
    for i, label in enumerate(labels):
        x, base = left + i * step + step * 0.15, float(10 + inner_h)
        for j, (name, values) in enumerate(series.items()):
            h = inner_h * values[i] / top
            base -= h
            parts.append(
                f'<rect x="{x:.1f}" y="{base:.1f}" width="{step * 0.7:.1f}" height="{h:.1f}" '
                f'fill="{_COLOURS[j % len(_COLOURS)]}"><title>{escape(label)} {escape(name)}: '
                f"{values[i]:.3g}</title></rect>"
            )
        parts.append(
            f'<text x="{x + step * 0.35:.1f}" y="{height - bottom + 24}" '
            f'text-anchor="middle">{escape(label)}</text>'
        )
    for j, name in enumerate(series):
        lx, ly = left + (j % 4) * 150, height + 4 + 20 * (j // 4)
        parts.append(
            f'<rect x="{lx}" y="{ly - 10}" width="10" height="10" '
            f'fill="{_COLOURS[j % len(_COLOURS)]}"/>'
            f'<text x="{lx + 14}" y="{ly}">{escape(name)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _table(head: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = "".join(f"<th>{escape(str(h))}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def render(report: Report) -> str:
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(report.until))
    window = (
        "all jobs"
        if report.since is None
        else f"jobs submitted in the {report.since / 86400:.3g} days to {when}"
    )
    out = [
        f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>stoker insights"
        f"</title><style>{_STYLE}</style></head><body><h1>stoker insights</h1>"
        f"<p>{escape(window)}; filters: {escape(json.dumps(report.filters))}</p>"
    ]
    for resource, totals in sorted(report.totals.items()):
        out.append(
            f'<div class="kpi">{escape(resource)}-hours<b>{totals.allocated_h:.3g}</b></div>'
            f'<div class="kpi">productive<b>{totals.productive_h:.3g}</b></div>'
            f'<div class="kpi">goodput<b data-goodput="{escape(resource)}">'
            f"{_pct(totals.goodput)}</b></div>"
            f'<div class="kpi">jobs (failed)<b>{totals.jobs} ({totals.failed_jobs})</b></div><br>'
        )
    days = sorted({d["day"] for d in report.daily})
    if days:
        out.append("<h2>Hours by day: productive and lost</h2>")
        productive = [
            sum(d["productive_hours"] for d in report.daily if d["day"] == day) for day in days
        ]
        allocated = [
            sum(d["allocated_hours"] for d in report.daily if d["day"] == day) for day in days
        ]
        lost = [a - p for a, p in zip(allocated, productive, strict=True)]
        chart = _columns(days, {"productive": productive, "lost": lost}, title="hours by day")
        rows = [
            [d, f"{a:.3g}", f"{p:.3g}", _pct(p / a if a else None)]
            for d, a, p in zip(days, allocated, productive, strict=True)
        ]
        out.append(
            f'<div class="chart">{chart}'
            f"{_table(['day', 'hours', 'productive', 'goodput'], rows)}</div>"
        )
    for resource, totals in sorted(report.totals.items()):
        causes = [c for c in CAUSES if totals.lost_h[c] > 0]
        out.append(f"<h2>Lost {escape(resource)}-hours by cause</h2>")
        chart = _bars(
            causes,
            [totals.lost_h[c] for c in causes],
            unit="h",
            title=f"lost {resource}-hours by cause",
            colour=_COLOURS[2],
        )
        rows = [[c, f"{totals.lost_h[c]:.3g}"] for c in causes]
        rows.append(["queue after requeue (wall h)", f"{totals.queue_after_requeue_h:.3g}"])
        if totals.unaccounted_h > 0:
            rows.append(["not accounted (own commands)", f"{totals.unaccounted_h:.3g}"])
        out.append(f'<div class="chart">{chart}{_table(["cause", "hours"], rows)}</div>')
    failures = sorted(report.failures.items(), key=lambda item: -item[1])
    out.append("<h2>Failures by class</h2>")
    if failures:
        chart = _bars(
            [c for c, _ in failures],
            [float(n) for _, n in failures],
            unit="jobs",
            title="failures by class",
            colour=_COLOURS[1],
        )
        rows = [[c, n, f"{report.failure_hours[c]:.3g}"] for c, n in failures]
        out.append(f'<div class="chart">{chart}{_table(["cause", "jobs", "hours"], rows)}</div>')
    else:
        out.append("<p>No job failed.</p>")
    out.append("<h2>Nodes in two or more incidents</h2>")
    if report.nodes:
        chart = _bars(
            [n.node for n in report.nodes],
            [float(n.incidents) for n in report.nodes],
            unit="incidents",
            title="failures by node",
            colour=_COLOURS[6],
        )
        rows = []
        for node in report.nodes:
            users, operators = node.advice()
            kinds = ", ".join(f"{k} x{v}" for k, v in sorted(node.kinds.items()))
            rows.append([node.node, node.incidents, kinds, ", ".join(node.jobs), users, operators])
        out.append(
            f'<div class="chart">{chart}</div>'
            + _table(["node", "incidents", "what", "jobs", "users", "operators"], rows)
        )
    else:
        out.append("<p>No node was implicated twice.</p>")
    mfu = report.mfu
    out.append("<h2>MFU of finished jobs</h2>")
    labels = [f"{100 * MFU_BINS[i]:.0f}-{100 * MFU_BINS[i + 1]:.0f}%" for i in range(10)]
    chart = _columns(labels, {"jobs": [float(n) for n in mfu.histogram]}, title="MFU histogram")
    rows = [
        ["jobs", mfu.count],
        ["p10", _pct(mfu.p10)],
        ["median", _pct(mfu.p50)],
        ["p90", _pct(mfu.p90)],
    ]
    out.append(f'<div class="chart">{chart}{_table(["", "MFU"], rows)}</div>')
    out.append("<p>Made by <code>stoker insights</code>.</p></body></html>")
    return "\n".join(out) + "\n"


def write_html(report: Report, path: Path) -> None:
    write_text_atomic(path, render(report))
