"""On the real cluster: a rank SIGKILLed while its loader runs leaves no process on the
node once the job ended: not its loader workers, its fork server or its resource tracker.

Here slurmstepd also reaps them (it adopts the step's orphans as a child subreaper and
kills what is left when the step ends), so this guards the user's view of the node; the
parent-death signal itself is proven where nothing else would end them, for a rank
outside SLURM (tests/data/stream/test_loader_orphans.py: without it, four processes stay)."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.launcher_jobs import submit_json, wait_final
from tests.process_table import marked_processes, wait_none_marked

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm

# A main guard: the loader's workers import the main module (multiprocessing's spawn).
RANK = """\
import os, signal, sys
from stoker.data.stream.loader import StreamingLoader
if __name__ == "__main__":
    loader = StreamingLoader(sys.argv[1], batch_size=2, num_workers=2, seed=1, fps=8,
                             size=(32, 32), clip_seconds=1.0, sample_rate=8000)
    next(loader.batches())
    print("workers up: killing myself", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_sigkilled_rank_leaves_nothing_running_on_its_node(
    slurm_cluster: ClusterSettings,
    synthetic_av_set: Callable[..., Path],
    tmp_path: Path,
) -> None:
    url = str(synthetic_av_set(clips=8, size=(32, 32), sample_rate=8000))
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    mark = uuid.uuid4().hex
    job = submit_json(
        "--time", "5", f"job.env.STOKER_TEST_MARK={mark}",
        "--", sys.executable, str(script), url, cwd=tmp_path,
    )  # fmt: skip
    assert wait_final(job["job_id"], 300) == "FAILED"
    log = (Path(job["run_dir"]) / "logs" / "r0" / "rank-0.log").read_text()
    assert "workers up" in log, log
    try:
        # The job has ended: what is left now would stay for good.
        wait_none_marked(f"STOKER_TEST_MARK={mark}", timeout=60)
    finally:
        import os
        import signal

        for pid in marked_processes(f"STOKER_TEST_MARK={mark}"):
            os.kill(pid, signal.SIGKILL)
