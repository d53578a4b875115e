"""benchmarks/gpu_check/gpu_tests.py lists exactly the test files that hold a test marked
`gpu`: a new GPU test in an unlisted file would never run on the GPU machine. Reads the
files' text rather than collecting (`pytest --collect-only -m gpu tests` took 9 s here)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# By path: this folder, tests/benchmarks, is the top-level `benchmarks` package under
# pytest (tests/ has no __init__.py), which hides the repository's own.
GPU_TEST_PATHS = runpy.run_path(str(REPO / "benchmarks/gpu_check/gpu_tests.py"))["GPU_TEST_PATHS"]
# The marker on a test, a class or a module (`pytestmark`), spelt with `pytest.` or not.
GPU_MARK = re.compile(r"\bmark\.gpu\b")


def _files_with_gpu_tests() -> set[str]:
    return {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "tests").rglob("*.py")
        if GPU_MARK.search(path.read_text(encoding="utf-8"))
    }


def test_every_file_with_a_gpu_test_is_listed_and_none_other() -> None:
    found = _files_with_gpu_tests()
    assert found, "no test marked gpu found under tests/: is the pattern still right?"
    listed = set(GPU_TEST_PATHS)
    assert not found - listed, (
        f"files with tests marked gpu missing from GPU_TEST_PATHS: {sorted(found - listed)}; "
        "fix: add them to benchmarks/gpu_check/gpu_tests.py"
    )
    assert not listed - found, (
        f"GPU_TEST_PATHS lists files without a test marked gpu: {sorted(listed - found)}; "
        "fix: remove them from benchmarks/gpu_check/gpu_tests.py"
    )
