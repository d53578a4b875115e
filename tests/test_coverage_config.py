"""tests/coverage.ini, as scripts/coverage-suite uses it: every Python process that
inherits COVERAGE_PROCESS_START is measured, and one that ends with os._exit, as a
training rank does (stoker/runtime/train.py), still saves its data. Without that, the
suite's coverage left out every line only a rank runs (train.register_final, the
trainer's end), and a before-and-after comparison read that as lost coverage."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import coverage

REPO = Path(__file__).resolve().parents[1]


def test_a_process_that_ends_with_os_exit_saves_its_coverage(tmp_path: Path) -> None:
    script = "import os\nfrom stoker.plural import plural\nplural(2, 'rank')\nos._exit(3)\n"
    env = {
        **os.environ,
        "COVERAGE_PROCESS_START": str(REPO / "tests" / "coverage.ini"),
        "COVERAGE_FILE": str(tmp_path / ".coverage"),
    }
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    saved = list(tmp_path.glob(".coverage.*"))
    assert len(saved) == 1, (saved, done.stderr)
    data = coverage.CoverageData(basename=str(saved[0]))
    data.read()
    plural = [f for f in data.measured_files() if f.endswith(os.path.join("stoker", "plural.py"))]
    assert plural, sorted(data.measured_files())
    # The function's body ran: its line is among those measured, not only the import.
    body = next(n for n, line in enumerate((REPO / "stoker" / "plural.py").open(), 1)
                if line.lstrip().startswith("return f"))  # fmt: skip
    assert body in (data.lines(plural[0]) or []), data.lines(plural[0])
