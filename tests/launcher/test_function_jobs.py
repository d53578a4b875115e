"""Python functions as jobs on the real cluster (`stoker.submit(fn, *args)`, submitit's
way): the value of global rank 0's call comes back; a function that raises shows its
traceback on the login node and in `stoker why`; a submitit Checkpointable stopped as by
its time limit (the batch script's USR2) is checkpointed, requeued by stoker's batch
script and continues from its checkpoint. `import stoker` imports no submitit
(tests/test_cli_imports.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import cloudpickle
import pytest

import stoker
from stoker.api import FunctionJobError
from tests.clirun import stoker_text
from tests.launcher import function_job_calls as calls

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
# As a user's script's functions travel: by value, not by a module the job imports.
cloudpickle.register_pickle_by_value(calls)


def test_a_function_returns_its_value_and_a_raise_comes_back_with_its_traceback(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    adds = stoker.submit(calls.add_on_every_rank, 2, 3, kwargs={"scale": 10}, nodes=1,
                         ntasks_per_node=2, time="5", cwd=tmp_path)  # fmt: skip
    raises = stoker.submit(calls.raise_bad_input, "x-17", time="5", cwd=tmp_path)
    assert adds.result(timeout=300) == {"sum": 50, "rank": "0", "world": "2"}
    assert adds.state() == "COMPLETED"
    status = stoker_text("status", adds.job_id, "--json", check=True)
    assert '"name": "add_on_every_rank"' in status.stdout

    with pytest.raises(FunctionJobError) as info:
        raises.result(timeout=300)
    assert "Traceback (most recent call last)" in info.value.message
    assert "ValueError: bad input: x-17" in info.value.message
    assert f"stoker logs {raises.job_id}" in (info.value.fix or "")
    assert raises.state() == "FAILED"
    why = stoker_text("why", raises.job_id)
    assert "ValueError: bad input: x-17" in why.stdout, why.stdout


def test_a_checkpointable_stopped_by_its_time_limit_continues_from_its_checkpoint(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    progress = tmp_path / "progress"
    job = stoker.submit(calls.CountTo(), 30, str(progress), time="5", cwd=tmp_path)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:  # a few steps into its first start
        text = progress.read_text() if progress.exists() else ""
        if text.startswith("0 ") and int(text.split()[1]) >= 3:
            break
        time.sleep(0.3)
    else:
        pytest.fail(f"the function did not count to 3 in 180 s: {progress}")
    # What SLURM sends the batch script before the time limit (--signal=B:USR2@...).
    subprocess.run(["scancel", "--batch", "--signal=USR2", job.job_id], check=True)
    result = job.result(timeout=300)
    assert result["restart"] == "1" and result["started_at"] >= 4, result
    assert progress.read_text().split() == ["1", "29"]
    events = (job.run_dir / "events").read_text()
    assert "requeued after" in events, events
