"""PyTorch's flight recorder as a hung job leaves it: two real gloo ranks, one that
never enters the collective the other waits in; each dumps its recorder into the run
folder, and `stoker why`'s reader names the rank that fell behind and the collective."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from stoker.launcher.why.collectives import find_laggard, read_traces
from stoker.runtime.dist import flight_recorder
from tests.mlflow_server import free_port

WORKER = Path(__file__).with_name("flight_worker.py")
REPO = Path(__file__).resolve().parents[3]


def test_the_rank_that_fell_behind_and_the_collective_are_named(tmp_path: Path) -> None:
    port = str(free_port())
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("TORCH_FR_BUFFER_SIZE", None)
    ranks = [subprocess.Popen([sys.executable, str(WORKER), str(rank), port, str(tmp_path)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for rank in (0, 1)]  # fmt: skip
    for process in ranks:
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    traces = read_traces(tmp_path, 0)
    assert sorted(traces) == [0, 1]
    laggard = find_laggard(traces)
    assert laggard is not None
    assert (laggard.ranks, laggard.waiting, laggard.last_seq, laggard.next_seq) == ([1], [0], 3, 4)
    assert laggard.last_name == "gloo:all_reduce" and "all_gather" in (laggard.next_name or "")
    assert laggard.describe().startswith("rank 1 fell behind in process group default_pg: "
                                         "ranks 0 wait in collective #4 (gloo:all")  # fmt: skip


def test_ranks_that_agree_name_no_one_and_nothing_outside_a_job(tmp_path: Path) -> None:
    entry = {"collective_seq_id": 5, "profiling_name": "gloo:all_reduce",
             "process_group": ["0", "default_pg"]}  # fmt: skip
    assert find_laggard({0: [entry], 1: [entry]}) is None
    assert read_traces(tmp_path, 0) == {}  # no dumps: nothing said
    environ: dict[str, str] = {}
    flight_recorder.configure(environ, cuda=True)
    assert environ == {}  # no run folder: torch's defaults
    environ = {"STOKER_RUN_DIR": str(tmp_path), "STOKER_RESTART": "2",
               "TORCH_FR_BUFFER_SIZE": "50"}  # fmt: skip
    flight_recorder.configure(environ, cuda=True)
    assert environ["TORCH_FR_BUFFER_SIZE"] == "50"  # the job's own value is kept
    assert environ["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert environ["TORCH_FR_DUMP_TEMP_FILE"].startswith(str(tmp_path / "flight" / "r2"))


def test_why_shows_the_flight_recorders_verdict_beside_the_watchdogs() -> None:
    from stoker.launcher.why import JobFacts, judge
    from stoker.launcher.why.collectives import Laggard
    from stoker.protocol import EXIT_HANG

    hang = {"rank": 1, "host": "n2", "phase": "data", "step": 3, "stalled_s": 31.0,
            "gone": False, "message": "rank 1 (n2) stalled in phase 'data' at step 3"}  # fmt: skip
    laggard = Laggard([1], "default_pg", 56, "gloo:all_reduce", [0], 57, "gloo:all_gather")
    facts = JobFacts(job_id="7", state="FAILED", exit_code=EXIT_HANG, hang=hang, restart=1,
                     laggard=laggard)  # fmt: skip
    diagnosis = judge(facts)
    assert diagnosis.cause == "hung"
    assert ("flight recorder (flight/r1/): rank 1 fell behind in process group default_pg: "
            "ranks 0 wait in collective #57 (gloo:all_gather), which rank 1 never entered "
            "(last: #56 gloo:all_reduce)") in diagnosis.evidence  # fmt: skip
