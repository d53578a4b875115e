"""What each test costs in CPU: the seconds of the pytest process and of the children it
waited for (subprocesses, local ranks, their workers), from setup to teardown. The suite
is CPU-bound on the 2-core VM (docs/operations.md, "The suite's budget"), so this, not
wall time alone, says which tests to share a run between.

At the end pytest prints the total and the costliest tests, and, with
STOKER_TEST_COST_DIR set (scripts/test-suite sets it), writes `<label>.json` there:
every test's wall and CPU seconds. A job's ranks on the SLURM cluster run under slurmd,
not under pytest: at the end, each SLURM job submitted while a test ran (its setup
included) adds `sacct`'s TotalCPU of all its steps to that test's `slurm_cpu_s`. A local
job's ranks (`stoker run`, `submit --local`) run under its supervisor, which outlives the
command that started it: each local job under pytest's temporary folder that started
while a test ran adds the `cpu_s` its supervisor recorded (local-state.json) to that
test's `local_cpu_s`.

Loaded from tests/conftest.py."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator
from datetime import datetime
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
        self.began_at = time.time()
        self.cpu_began = _cpu()
        self.slurm_conf: str | None = None  # the cluster's, as a test last saw it
        # Taken out of the environment: a pytest that a test starts (the GPU check's
        # part d) would otherwise write its own figures over this process's.
        self.where = os.environ.pop("STOKER_TEST_COST_DIR", None)
        self.label = os.environ.pop("STOKER_TEST_COST_LABEL", "pytest")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        began_at, wall, (own, children) = time.time(), time.monotonic(), _cpu()
        yield
        own_after, children_after = _cpu()
        self.rows.append(
            {
                "test": item.nodeid,
                "wall_s": round(time.monotonic() - wall, 3),
                "cpu_s": round(own_after - own + children_after - children, 3),
                "children_cpu_s": round(children_after - children, 3),
                # Unrounded: a job that starts less than a millisecond before a short
                # test ends must fall inside its window (a local job's start, here).
                "began_at": began_at,
                "ended_at": time.time(),
            }
        )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> None:
        # While the test runs: the slurm_cluster fixture sets it for the session and
        # unsets it in the last test's teardown.
        self.slurm_conf = os.environ.get("SLURM_CONF", self.slurm_conf)

    def add_slurm_cpu(self) -> None:
        """Each SLURM job's TotalCPU (all its steps) to the test it was submitted in.
        Needs the cluster still up at the end (make test's; a cluster the fixture
        started is stopped by then)."""
        if self.slurm_conf is None or shutil.which("sacct") is None:
            return
        jobs = slurm_jobs_cpu(self.slurm_conf, self.began_at)
        for row in self.rows:
            mine = [cpu for at, cpu in jobs if row["began_at"] <= at <= row["ended_at"]]
            if mine:
                row["slurm_cpu_s"] = round(sum(mine), 1)
                row["slurm_jobs"] = len(mine)

    def add_local_cpu(self, under: Path) -> None:
        """Each local job's CPU seconds to the test it started in."""
        jobs = local_jobs_cpu(under)
        for row in self.rows:
            mine = [cpu for at, cpu in jobs if row["began_at"] <= at <= row["ended_at"]]
            if mine:
                row["local_cpu_s"] = round(sum(mine), 1)
                row["local_jobs"] = len(mine)

    def summary(self) -> dict[str, Any]:
        own, children = _cpu()
        return {
            "label": self.label,
            "wall_s": round(time.monotonic() - self.began, 1),
            "cpu_s": round(own + children - sum(self.cpu_began), 1),
            "tests_cpu_s": round(sum(r["cpu_s"] for r in self.rows), 1),
            "slurm_cpu_s": round(sum(r.get("slurm_cpu_s", 0) for r in self.rows), 1),
            "local_cpu_s": round(sum(r.get("local_cpu_s", 0) for r in self.rows), 1),
            "tests": len(self.rows),
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.rows:
            return
        # The account never fails a suite: what it cannot read is said, not raised (a
        # raise here ends pytest with a traceback after its summary, exit 1).
        not_counted = []
        try:
            self.add_slurm_cpu()
        except Exception as error:  # sacct timed out, or its output changed
            not_counted.append(f"SLURM jobs' CPU not counted: {error!r}")
        factory = getattr(terminalreporter.config, "_tmp_path_factory", None)
        try:
            if factory is not None:
                self.add_local_cpu(factory.getbasetemp())
        except Exception as error:
            not_counted.append(f"local jobs' CPU not counted: {error!r}")
        total = self.summary()
        terminalreporter.section("CPU cost (this process and the children it waited for)")
        for line in not_counted:
            terminalreporter.write_line(line)
        terminalreporter.write_line(
            f"{total['tests']} tests: {total['tests_cpu_s']:.0f} CPU-s in tests, "
            f"{total['cpu_s']:.0f} CPU-s in all, {total['wall_s']:.0f} s wall"
            + (f"; SLURM jobs {total['slurm_cpu_s']:.0f} CPU-s" if total["slurm_cpu_s"] else "")
            + (f"; local jobs {total['local_cpu_s']:.0f} CPU-s" if total["local_cpu_s"] else "")
        )
        for row in sorted(self.rows, key=lambda r: -cost(r))[:SHOWN]:
            jobs = [
                f"{kind} {row[key]:.1f}"
                for kind, key in (("SLURM", "slurm_cpu_s"), ("local", "local_cpu_s"))
                if row.get(key)
            ]
            terminalreporter.write_line(
                f"{cost(row):8.1f} CPU-s {row['wall_s']:8.1f} s  {row['test']}"
                + (f" ({', '.join(jobs)})" if jobs else "")
            )
        if self.where:
            path = Path(self.where) / f"{total['label']}.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**total, "rows": self.rows}, indent=1) + "\n")


def cost(row: dict[str, Any]) -> float:
    """A test's CPU seconds: its process and children, its SLURM and local jobs' ranks."""
    return float(row["cpu_s"]) + float(row.get("slurm_cpu_s", 0)) + float(row.get("local_cpu_s", 0))


def local_jobs_cpu(under: Path) -> list[tuple[float, float]]:
    """(start time, CPU seconds) of every ended local job whose run folder is under
    `under` (its local-state.json, stoker/launcher/local/state.py)."""
    from stoker.launcher.jobs.rundir import RunDir
    from stoker.launcher.local.state import read_local_state

    jobs = []
    # os.walk, not Path.rglob: a job or test process still running at the session's end
    # may remove a folder while it is walked (a checkpoint's staging folder renamed), and
    # rglob raises FileNotFoundError for it (the likeliest cause of CI's failure on
    # 2026-12-02); walk skips it. A job still running has no cpu_s yet anyway.
    for folder, _, files in os.walk(under):
        if "local-state.json" in files:
            state = read_local_state(RunDir(Path(folder)))
            if state is not None and state.started is not None and state.cpu_s is not None:
                jobs.append((state.started, state.cpu_s))
    return jobs


def slurm_jobs_cpu(slurm_conf: str, since: float) -> list[tuple[float, float]]:
    """(submit time, TotalCPU seconds of all its steps) of every job submitted since."""
    start = datetime.fromtimestamp(since - 1).strftime("%Y-%m-%dT%H:%M:%S")
    listed = subprocess.run(
        ["sacct", "-a", "-n", "-P", "-S", start, "-o", "JobIDRaw,Submit,TotalCPU"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "SLURM_CONF": slurm_conf},
    )  # fmt: skip
    return parse_sacct(listed.stdout)


def parse_sacct(text: str) -> list[tuple[float, float]]:
    """`sacct -n -P -o JobIDRaw,Submit,TotalCPU` as (job's submit time, its steps' CPU)."""
    submitted: dict[str, float] = {}
    cpu: dict[str, float] = {}
    for line in text.splitlines():
        job_id, submit, total = [*line.split("|"), "", ""][:3]
        job, _, step = job_id.partition(".")
        if not step:
            try:
                submitted[job] = datetime.fromisoformat(submit).timestamp()
            except ValueError:
                continue
        else:
            cpu[job] = cpu.get(job, 0.0) + slurm_seconds(total)
    return [(at, cpu.get(job, 0.0)) for job, at in submitted.items()]


def slurm_seconds(text: str) -> float:
    """sacct's [D-][HH:]MM:SS[.mmm] in seconds ("" or "INVALID": 0)."""
    days, _, clock = text.strip().rpartition("-")
    try:
        parts = [float(p) for p in clock.split(":")]
    except ValueError:
        return 0.0
    seconds = 0.0
    for part in parts:
        seconds = seconds * 60 + part
    return seconds + (int(days) * 86400 if days else 0)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(CpuCost(), "stoker-cpu-cost")
