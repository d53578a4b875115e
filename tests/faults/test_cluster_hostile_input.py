"""Hostile values through the real cluster: shell metacharacters in job.env and
in the command neither execute nor break the job, and a hostile job name is refused
before anything is created. (test_hostile_input.py covers the space of inputs with
hypothesis against shims; this is the same promise on the real scheduler.)"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.clirun import stoker_text
from tests.launcher_jobs import rank_lines, submit_json, wait_final

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
PYTHON = sys.executable


HOSTILE = [
    "$(touch PWNED1)",
    "`touch PWNED2`",
    'it\'s "quoted"',
    "a; touch PWNED3",
    "x\ntouch PWNED4",
]


def test_hostile_values_neither_execute_nor_break_the_job(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    overrides = [f"job.env.EVIL{i}={v}" for i, v in enumerate(HOSTILE)]
    printer = (
        "import os, sys; print(repr(sys.argv[1:])); "
        "print(repr([os.environ[f'EVIL{i}'] for i in range(5)]))"
    )
    job = submit_json(
        *overrides, "--time", "5", "--", PYTHON, "-c", printer, *HOSTILE, cwd=tmp_path
    )
    assert wait_final(job["job_id"]) == "COMPLETED"
    out = rank_lines(Path(job["run_dir"]))[0].splitlines()
    assert out == [repr(HOSTILE), repr(HOSTILE)]
    assert not list(tmp_path.rglob("PWNED*")) and not list(Path(job["run_dir"]).rglob("PWNED*"))

    # A job name is refused before anything is created: it names the value and the rule.
    before = list((Path(os.environ["STOKER_HOME"]) / "runs").iterdir())
    refused = stoker_text("submit", "--name", "x$(touch PWNED5)", "--", "true", cwd=tmp_path)
    assert refused.returncode == 2
    assert "job.name" in refused.stderr and "x$(touch PWNED5)" in refused.stderr
    assert list((Path(os.environ["STOKER_HOME"]) / "runs").iterdir()) == before
    assert not list(tmp_path.rglob("PWNED*"))
