"""What each test costs in CPU: the seconds of the pytest process and of the children it
waited for (subprocesses, local ranks, their workers), from setup to teardown. The suite
is CPU-bound on the 2-core VM (docs/operations.md, "The suite's budget"), so this, not
wall time alone, says which tests to share a run between.

At the end pytest prints the total and the costliest tests, and, with
STOKER_TEST_COST_DIR set (scripts/test-suite sets it), writes `<label>.json` there:
every test's wall and CPU seconds. A job's ranks on the SLURM cluster run under slurmd,
not under pytest: their CPU is in `sacct`'s TotalCPU, not here.

Loaded from tests/conftest.py."""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SHOWN = 15


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


class CpuCost:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.began = time.monotonic()
        self.cpu_began = _cpu()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        wall, (own, children) = time.monotonic(), _cpu()
        yield
        own_after, children_after = _cpu()
        self.rows.append(
            {
                "test": item.nodeid,
                "wall_s": round(time.monotonic() - wall, 3),
                "cpu_s": round(own_after - own + children_after - children, 3),
                "children_cpu_s": round(children_after - children, 3),
            }
        )

    def summary(self) -> dict[str, Any]:
        own, children = _cpu()
        return {
            "label": os.environ.get("STOKER_TEST_COST_LABEL", "pytest"),
            "wall_s": round(time.monotonic() - self.began, 1),
            "cpu_s": round(own + children - sum(self.cpu_began), 1),
            "tests_cpu_s": round(sum(r["cpu_s"] for r in self.rows), 1),
            "tests": len(self.rows),
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        total = self.summary()
        terminalreporter.section("CPU cost (this process and the children it waited for)")
        terminalreporter.write_line(
            f"{total['tests']} tests: {total['tests_cpu_s']:.0f} CPU-s in tests, "
            f"{total['cpu_s']:.0f} CPU-s in all, {total['wall_s']:.0f} s wall"
        )
        for row in sorted(self.rows, key=lambda r: -r["cpu_s"])[:SHOWN]:
            terminalreporter.write_line(
                f"{row['cpu_s']:8.1f} CPU-s {row['wall_s']:8.1f} s  {row['test']}"
            )
        where = os.environ.get("STOKER_TEST_COST_DIR")
        if where:
            path = Path(where) / f"{total['label']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**total, "rows": self.rows}, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuCost(), "stoker-cpu-cost")
