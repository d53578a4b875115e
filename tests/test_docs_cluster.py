"""The docs' commands and snippets that run on the local SLURM cluster: the README's jobs
tour and the function submitted as a job (docs/jobs.md). In their own module so that the
rest of tests/test_docs.py runs beside the cluster tests (`make test` runs a module with a
test on the cluster in the cluster tests' process, one test at a time)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.clirun import stoker, stoker_text
from tests.test_docs import JOBS_TOUR, ON_THE_CLUSTER, REPO, SNIPPETS, run_snippet

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings


@pytest.mark.slurm
def test_jobs_tour_runs_on_the_cluster(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    assert len(JOBS_TOUR) >= 4
    (tmp_path / "examples").symlink_to(REPO / "examples")
    for command in JOBS_TOUR:
        args = shlex.split(command)
        assert args[0] == "stoker"
        # `python` in the README is whatever python the user has; here, this venv's.
        args = [sys.executable if a == "python" else a for a in args]
        # In this process, but for a --local submit: its supervisor is the submitting
        # process's child, and outlives it.
        run = stoker if "--local" in args else stoker_text
        result = run(*args[1:], cwd=tmp_path)
        assert result.returncode == 0, f"{command}: {result.stderr}"
        if args[1] == "status":  # the job is named after its command
            assert re.search(r"^\d+ +python ", result.stdout, re.M), result.stdout


ON_SLURM = [(where, code) for where, code in SNIPPETS if ON_THE_CLUSTER in code]


def test_a_function_job_snippet_is_in_the_docs() -> None:
    assert ON_SLURM, f"no snippet of the docs calls {ON_THE_CLUSTER!r} any more"


@pytest.mark.slurm
@pytest.mark.parametrize(("where", "code"), ON_SLURM, ids=[where for where, _ in ON_SLURM])
def test_each_function_job_snippet_runs_on_the_cluster(
    where: str, code: str, slurm_cluster: ClusterSettings, tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    """As written, on the local cluster (1 node, its fake GPUs): its value comes back."""
    run_snippet(where, code, tmp_path, request)
