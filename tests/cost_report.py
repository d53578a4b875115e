"""The suite's budget at the end of `make test`: the wall time of each part (install,
cluster start, each pytest process, lint) and the tests that cost most CPU, read from
what scripts/test-suite and tests/cpu_cost.py left in STOKER_TEST_COST_DIR.

    python -m tests.cost_report DIR      (from the repository root)

`DIR/parts.tsv` has one `label<TAB>seconds[<TAB>side]` line per part (the Makefile and
scripts/test-suite time them; "side": a process that ran beside another, shown but not
added to the total);
`DIR/<process>.json` one document per pytest process (tests/cpu_cost.py);
`DIR/proc-stat.start` and `.end` the first line of /proc/stat as `make test` began and
ended: the CPU seconds the whole machine spent in between (every process: pytest, the
commands and ranks it started, the SLURM daemons and jobs, the servers). On a VM that
runs only the suite, that is the suite's CPU, which per-process figures undercount
(a job's ranks under slurmd, workers forked by a fork server nobody waits for)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tests.cpu_cost import cost

BUDGET_S = 20 * 60
SHOWN = 20
# The VM's speed drifts: on 2026-11-28 the same work cost 1x, 1.7x, then 3.1x its morning
# CPU within hours (docs/operations.md). These modules' tests run in the pytest process
# alone (no subprocess, no server, no SLURM), so their CPU seconds measure the machine,
# not the suite's layout: a run's wall time is read against them.
YARDSTICK = (
    "tests/kernels/test_cross_entropy.py",
    "tests/kernels/test_rope.py",
    "tests/kernels/test_glu.py",
    "tests/runtime/test_models.py",
    "tests/runtime/test_mfu.py",
    "tests/runtime/test_bench_step.py",
    "tests/checkpoint/test_export.py",
)
YARDSTICK_MORNING_CPU_S = 72.3
"""Their CPU seconds in the run of d1feb88 (2026-11-28, 30 min 5 s)."""


def machine_cpu_s(where: Path) -> float | None:
    """Busy CPU seconds between DIR/proc-stat.start and .end (user, nice, system, irq,
    softirq, steal; not idle or iowait); None without both."""
    marks = [where / "proc-stat.start", where / "proc-stat.end"]
    if not all(mark.exists() for mark in marks):
        return None
    start, end = ([int(v) for v in m.read_text().split()[1:]] for m in marks)
    busy = (0, 1, 2, 5, 6, 7)  # the fields' order: user nice system idle iowait irq ...
    ticks = sum(end[i] - start[i] for i in busy)
    return ticks / os.sysconf("SC_CLK_TCK")


def report(where: Path) -> str:
    lines = ["", "=== the suite's budget (docs/operations.md) ==="]
    parts = where / "parts.tsv"
    total = 0.0
    if parts.exists():
        for line in parts.read_text().splitlines():
            label, seconds, *side = line.split("\t")
            if side and side[0] == "side":
                lines.append(f"  {label:<34} {float(seconds):8.0f} s (side by side)")
                continue
            total += float(seconds)
            lines.append(f"{label:<36} {float(seconds):8.0f} s")
        lines.append(f"{'make test':<36} {total:8.0f} s of {BUDGET_S} s")
    busy = machine_cpu_s(where)
    if busy is not None:
        lines.append(f"{'machine CPU, all processes':<28} {busy:8.0f} CPU-s (/proc/stat)")
    rows = []
    for path in sorted(where.glob("*.json")):
        doc = json.loads(path.read_text())
        lines.append(
            f"pytest {doc['label']:<21} {doc['wall_s']:8.0f} s wall, {doc['cpu_s']:.0f} CPU-s "
            f"({doc['tests']} tests, {doc['tests_cpu_s']:.0f} CPU-s in tests"
            + (f", {doc['slurm_cpu_s']:.0f} in its SLURM jobs" if doc.get("slurm_cpu_s") else "")
            + (f", {doc['local_cpu_s']:.0f} in its local jobs" if doc.get("local_cpu_s") else "")
            + ")"
        )
        rows += doc["rows"]
    yardstick = sum(float(r["cpu_s"]) for r in rows if r["test"].split("::")[0] in YARDSTICK)
    if yardstick:
        lines.append(
            f"{'speed yardstick':<36} {yardstick:8.1f} CPU-s in the in-process unit tests of "
            f"{len(YARDSTICK)} modules ({yardstick / YARDSTICK_MORNING_CPU_S:.2f}x the "
            f"{YARDSTICK_MORNING_CPU_S} of d1feb88's 30 min run)"
        )
    if rows:
        lines.append(
            "costliest tests (CPU-s of the pytest process, its children, its SLURM and local "
            "jobs; of them SLURM, local; wall s):"
        )
        for row in sorted(rows, key=lambda r: -cost(r))[:SHOWN]:
            slurm, local = row.get("slurm_cpu_s", 0), row.get("local_cpu_s", 0)
            lines.append(
                f"{cost(row):8.1f} {slurm:6.1f} {local:6.1f} {row['wall_s']:8.1f}  {row['test']}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))
