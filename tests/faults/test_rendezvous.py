"""A rank that never joins, on the real cluster: the job fails within the rendezvous
timeout (45 s by default), not the collective's, and `stoker why` names the rank and
its node."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.clirun import stoker
from tests.faults.training_jobs import FAST, TINY
from tests.launcher_jobs import submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm

# Every task but global rank 3 (node n2's second) starts the runtime; rank 3 hangs first,
# as a task stuck in a container start or a dead mount does.
NEVER_JOINS = (
    'if [ "$RANK" = 3 ]; then sleep 600; fi; '
    f'exec {sys.executable} -m stoker.runtime.train --config "$STOKER_CONFIG"'
)


def test_a_rank_that_never_joins_fails_the_job_within_a_minute_named_by_why(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    job = submit_json(
        TINY, *FAST, "train.steps=5", "--nodes", "2", "--ntasks-per-node", "2",
        "--time", "10", "--", "bash", "-c", NEVER_JOINS, cwd=tmp_path,
    )  # fmt: skip
    run_dir = Path(job["run_dir"])
    rank0 = run_dir / "logs/r0/rank-0.log"

    def waiting() -> bool:
        return rank0.exists() and "stoker: rendezvous at " in rank0.read_text()

    # Generous: four ranks import torch on a loaded 2-core machine first.
    wait_for(waiting, 300, "rank 0 at the rendezvous")
    arrived = time.monotonic()
    assert wait_final(job["job_id"], 180, run_dir) == "FAILED"
    took = time.monotonic() - arrived
    assert took < 60, f"failed {took:.0f} s after rank 0 reached the rendezvous"
    print(f"\nthe job failed {took:.0f} s after rank 0 reached the rendezvous")

    log = rank0.read_text()
    assert "rendezvous: 1 of 4 ranks did not join within 45 s" in log, log[-2000:]
    node = json.loads(stoker("status", job["job_id"], "--json", check=True).stdout)[0]
    assert node["state"] == "FAILED"
    why = stoker("why", job["job_id"], "--json")
    assert why.returncode == 0, why.stderr
    diagnosis = json.loads(why.stdout)
    assert diagnosis["cause"] == "rendezvous", diagnosis
    assert "missing rank 3 (node n" in diagnosis["summary"], diagnosis
    assert "train.rendezvous_timeout_s" in diagnosis["fix"]
