"""tests/module_queue.py: pytest processes that share a folder run each collected test
exactly once between them, a whole module in one process (its module fixture built
once), and refuse to share when they collected different tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

MODULE = textwrap.dedent("""
    import os, time
    import pytest

    @pytest.fixture(scope="module")
    def built(tmp_path_factory):
        # One line per build, from whichever process runs the module.
        with open(os.environ["BUILDS"], "a") as out:
            out.write(__name__ + "\\n")
        return __name__

    @pytest.mark.parametrize("n", range({tests}))
    def test_it(built, n):
        with open(os.environ["RAN"], "a") as out:
            out.write(f"{{built}} {{n}} {{os.environ['STOKER_TEST_COST_LABEL']}}\\n")
        time.sleep(0.05)
""")


def _suite(tmp_path: Path) -> Path:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["tests.module_queue"]\n')
    for i in range(6):
        (suite / f"test_m{i}.py").write_text(MODULE.format(tests=i + 2))
    return suite


def _start(suite: Path, queue: Path, label: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "STOKER_TEST_QUEUE": str(queue),
        "STOKER_TEST_COST_LABEL": label,
        "RAN": str(suite.parent / "ran.txt"),
        "BUILDS": str(suite.parent / "builds.txt"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite), *args],
        env=env, cwd=suite, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def test_processes_sharing_a_queue_run_each_test_once_a_module_in_one_process(
    tmp_path: Path,
) -> None:
    suite = _suite(tmp_path)
    procs = [_start(suite, tmp_path / "queue", label) for label in ("a", "b")]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    ran = (tmp_path / "ran.txt").read_text().split("\n")[:-1]
    expected = {f"test_m{i} {n}" for i in range(6) for n in range(i + 2)}
    seen = [line.rsplit(" ", 1)[0] for line in ran]
    assert sorted(seen) == sorted(expected)  # every test, none twice
    by_module: dict[str, set[str]] = {}
    for line in ran:
        module, _, label = line.split(" ")
        by_module.setdefault(module, set()).add(label)
    assert all(len(labels) == 1 for labels in by_module.values()), by_module
    builds = (tmp_path / "builds.txt").read_text().split()
    assert sorted(builds) == sorted(f"test_m{i}" for i in range(6))  # one build a module
    # Each process says what it ran; together, all six modules.
    counts = [int(out.split("ran ")[1].split(" modules")[0]) for out in outputs]
    assert sum(counts) == 6, outputs


def test_a_process_that_collected_other_tests_refuses_to_share(tmp_path: Path) -> None:
    suite = _suite(tmp_path)
    queue = tmp_path / "queue"
    first = _start(suite, queue, "a")
    assert first.communicate(timeout=300)[0] and first.returncode == 0
    other = _start(suite, queue, "b", "-k", "test_m1")
    out = other.communicate(timeout=300)[0]
    assert other.returncode != 0
    assert "collected other tests than the first process" in out, out
    assert str(queue) in out


def test_the_longest_modules_start_first_the_rest_in_collection_order() -> None:
    from types import SimpleNamespace
    from typing import Any, cast

    from tests.module_queue import LONGEST_FIRST, modules_in_order

    nodeids = ["tests/a.py::t1", LONGEST_FIRST[1] + "::t", "tests/b.py::t", "tests/a.py::t2"]
    nodeids.append(LONGEST_FIRST[0] + "::t")
    items = cast(Any, [SimpleNamespace(nodeid=n) for n in nodeids])
    order = [(module, [i.nodeid for i in group]) for module, group in modules_in_order(items)]
    assert order == [
        (LONGEST_FIRST[0], [LONGEST_FIRST[0] + "::t"]),
        (LONGEST_FIRST[1], [LONGEST_FIRST[1] + "::t"]),
        ("tests/a.py", ["tests/a.py::t1", "tests/a.py::t2"]),
        ("tests/b.py", ["tests/b.py::t"]),
    ]
