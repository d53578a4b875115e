"""Every test module under tests/ is collected: a folder whose name pytest passes over
(its `norecursedirs`, which by default include `dist` and `build`) would drop its
tests from the suite without a word (tests/runtime/dist/ did, once)."""

from __future__ import annotations

from fnmatch import fnmatch
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def test_no_test_module_lies_in_a_folder_pytest_passes_over(pytestconfig: pytest.Config) -> None:
    patterns = pytestconfig.getini("norecursedirs")
    passed_over = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("test_*.py")
        if any(
            fnmatch(folder, p) for folder in path.relative_to(TESTS).parts[:-1] for p in patterns
        )
    ]
    assert not passed_over, f"never collected (norecursedirs {patterns}): {passed_over}"
