"""tests/cpu_cost.py and tests/cost_report.py: each test's CPU seconds, its children's
included, and the budget table `make test` prints at its end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_a_tests_cpu_counts_the_children_it_waited_for_and_the_report_ranks_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent("""
        import subprocess, sys

        def test_busy_child():
            burn = "import time\\nt = time.process_time()\\n" \\
                "while time.process_time() - t < 0.6: pass"
            subprocess.run([sys.executable, "-c", burn], check=True)

        def test_idle():
            import os
            # A pytest this test started must not write over the figures.
            assert "STOKER_TEST_COST_DIR" not in os.environ

        def test_local_job(tmp_path):
            # What a local job's supervisor records at its end (its ranks' CPU included).
            import json, time
            state = {"state": "COMPLETED", "started": time.time(), "cpu_s": 0.3}
            (tmp_path / "local-state.json").write_text(json.dumps(state))
    """)
    )
    costs = tmp_path / "costs"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.cpu_cost", "-p", "no:cacheprovider",
         "-q", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_sample.py")],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), "STOKER_TEST_COST_DIR": str(costs),
             "STOKER_TEST_COST_LABEL": "sample"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU cost" in done.stdout
    doc = json.loads((costs / "sample.json").read_text())
    rows = {r["test"].rsplit("::", 1)[1]: r for r in doc["rows"]}
    assert rows["test_busy_child"]["children_cpu_s"] >= 0.5
    assert rows["test_idle"]["cpu_s"] < 0.3
    assert rows["test_local_job"]["local_cpu_s"] == 0.3 and "local_cpu_s" not in rows["test_idle"]
    assert doc["local_cpu_s"] == 0.3

    (costs / "parts.tsv").write_text(
        "install\t100\npytest: cluster modules\t650\tside\npytest: the other modules\t690\tside\n"
        "pytest: both processes\t700\n"
    )
    # 100 s of user, 50 of nice, 30 of system, 20 of softirq at 100 ticks a second;
    # idle and iowait do not count.
    (costs / "proc-stat.start").write_text("cpu  1000 0 0 5000 300 0 0 0 0 0\n")
    (costs / "proc-stat.end").write_text("cpu  11000 5000 3000 99000 900 0 2000 0 0 0\n")
    table = subprocess.run(
        [sys.executable, "-m", "tests.cost_report", str(costs)], cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert "make test" in table and "800 s of 1200 s" in table
    ticks = os.sysconf("SC_CLK_TCK")
    assert f"{20000 / ticks:8.0f} CPU-s (/proc/stat)" in table
    ranked = table[table.index("costliest") :].splitlines()[1:]
    assert "test_busy_child" in ranked[0]
    local_row = next(line for line in ranked if "test_local_job" in line)
    assert local_row.split()[1:3] == ["0.0", "0.3"], local_row  # of its CPU-s: SLURM, local
    # The speed yardstick sums only the in-process unit tests' modules.
    from tests.cost_report import YARDSTICK, YARDSTICK_MORNING_CPU_S

    doc["rows"] += [
        {"test": f"{YARDSTICK[0]}::a", "cpu_s": 30.0, "wall_s": 30.0},
        {"test": f"{YARDSTICK[-1]}::b", "cpu_s": 8.75, "wall_s": 9.0},
    ]
    (costs / "sample.json").write_text(json.dumps(doc))
    table = subprocess.run(
        [sys.executable, "-m", "tests.cost_report", str(costs)], cwd=REPO,
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    ratio = 38.75 / YARDSTICK_MORNING_CPU_S
    assert f"    38.8 CPU-s in the in-process unit tests of 7 modules ({ratio:.2f}x" in table


def test_sacct_total_cpu_is_summed_over_a_jobs_steps() -> None:
    from datetime import datetime

    from tests.cpu_cost import parse_sacct, slurm_seconds

    assert slurm_seconds("00:07.745") == 7.745
    assert slurm_seconds("01:02:03") == 3723
    assert slurm_seconds("1-00:00:01") == 86401
    assert slurm_seconds("") == 0 and slurm_seconds("INVALID") == 0
    listed = (
        "2|2026-11-28T12:37:26|00:07.745\n2.batch|2026-11-28T12:37:27|00:00.160\n"
        "2.0|2026-11-28T12:37:27|00:07.585\n5|2026-11-28T12:39:36|00:00:00\n"
    )
    jobs = dict(parse_sacct(listed))
    submit = datetime.fromisoformat("2026-11-28T12:37:26").timestamp()
    assert jobs[submit] == 7.745  # the steps', not the allocation line counted again
    assert jobs[datetime.fromisoformat("2026-11-28T12:39:36").timestamp()] == 0


def test_local_jobs_are_read_while_folders_vanish_under_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process still running at the session's end removes a folder while the account
    walks pytest's temporary folder: the walk goes on (CI failed with FileNotFoundError
    after every test had passed)."""
    import shutil

    from tests.cpu_cost import local_jobs_cpu

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "local-state.json").write_text(
        json.dumps({"state": "COMPLETED", "started": 100.0, "cpu_s": 2.5})
    )
    (tmp_path / "staging" / "deep").mkdir(parents=True)
    scandir = os.scandir

    def scandir_after_removal(path: str | os.PathLike[str] = ".") -> Any:
        if str(path).endswith("staging"):
            shutil.rmtree(path)  # renamed away by the process that wrote it
        return scandir(path)

    monkeypatch.setattr(os, "scandir", scandir_after_removal)
    assert local_jobs_cpu(tmp_path) == [(100.0, 2.5)]
