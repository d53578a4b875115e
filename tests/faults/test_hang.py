"""The hang watchdog on the real cluster (two nodes, one task each) with the
real runtime: rank 1's data stops coming at step 3; within train.hang_timeout_s
plus a few heartbeats the job fails, every rank's Python stack is in its log,
the batch script starts it again without the stalled rank's node
(job.max_restarts), and `stoker why` names the stalled rank, its phase and its
stack."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.protocol import EXIT_HANG, STACK_HEADER
from stoker.runtime.observe.heartbeat import (
    PY_SPY_HEADER,
    Beat,
    Heartbeat,
    announce_exit,
    find_stall,
    folder_for,
    silent_ranks,
)
from tests.clirun import stoker
from tests.faults.training_jobs import (
    TWO_NODES,
    hostnames,
    job_processes,
    starts,
    synth_experiment,
)
from tests.launcher_jobs import scontrol_job, submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

HANG_RANK = Path(__file__).with_name("hang_rank.py")
TIMEOUT_S = 5


def test_find_stall_blames_the_rank_outside_the_collective() -> None:
    now = 1000.0
    beats = [
        Beat(0, "n1", 1, 7, "sync", progress_at=now - 60, written_at=now - 1),
        Beat(1, "n1", 2, 7, "data", progress_at=now - 50, written_at=now - 1),
        Beat(2, "n2", 3, 7, "sync", progress_at=now - 55, written_at=now - 1),
    ]
    stall = find_stall(beats, now, timeout_s=30)
    assert stall is not None and (stall.rank, stall.phase, stall.gone) == (1, "data", False)
    assert find_stall(beats, now, timeout_s=70) is None
    # A rank whose heartbeat thread stopped writing (killed) comes first.
    gone = Beat(3, "n2", 4, 6, "forward", progress_at=now - 40, written_at=now - 40)
    stall = find_stall([*beats, gone], now, timeout_s=30)
    assert stall is not None and (stall.rank, stall.gone) == (3, True)
    assert "stopped writing heartbeats" in stall.describe(30)


def test_a_ranks_first_step_has_a_longer_allowance(tmp_path: Path) -> None:
    """The first step of a process (workers starting, first fetches) may take
    WARMUP_FACTOR x the timeout; a later step may not. Found in a run of the fault tests
    on a loaded machine: a restarted rank's first batch took 5.1 s, with a 5 s timeout."""
    now = 1000.0
    first = Beat(1, "n3", 2, 1, "data", progress_at=now - 12, written_at=now - 1, warming=True)
    waiting = Beat(0, "n1", 1, 1, "sync", progress_at=now - 11, written_at=now - 1, warming=True)
    assert find_stall([waiting, first], now, timeout_s=5) is None  # 12 s < 3 x 5 s
    stall = find_stall([waiting, first], now + 4, timeout_s=5)
    assert stall is not None and (stall.rank, stall.phase, stall.step) == (1, "data", 1)
    later = Beat(1, "n3", 2, 3, "data", progress_at=now - 6, written_at=now - 1)
    assert find_stall([later], now, timeout_s=5) is not None

    heartbeat = Heartbeat(tmp_path, rank=0, world_size=1, restart=0, timeout_s=5)
    heartbeat.start()
    try:
        read = lambda: Beat.read(tmp_path / "heartbeat" / "r0" / "rank-0.json")  # noqa: E731
        assert read().warming  # type: ignore[union-attr]
        for step, phase in ((41, "data"), (41, "forward"), (41, "sync")):  # resumed at 41
            heartbeat.beat(step, phase)
            heartbeat._write()
            assert read().warming  # type: ignore[union-attr]
        heartbeat.beat(42, "data")
        heartbeat._write()
        assert not read().warming  # type: ignore[union-attr]
    finally:
        heartbeat.stop()


def test_a_rank_that_lost_its_peer_names_the_frozen_one(tmp_path: Path) -> None:
    """The exit file of a rank whose collective timed out names the peers whose heartbeat
    had stopped (the batch script then blames no node for SLURM's kill of them)."""
    now = 1000.0
    folder = folder_for(tmp_path, 1)
    folder.mkdir(parents=True)
    for beat in (Beat(0, "n1", 1, 7, "sync", now - 20, now - 1),
                 Beat(1, "n2", 2, 7, "forward", now - 25, now - 25),  # stopped
                 Beat(2, "n2", 3, 7, "sync", now - 20, now - 4)):  # fmt: skip
        (folder / f"rank-{beat.rank}.json").write_text(json.dumps(beat.__dict__))
    assert silent_ranks(tmp_path, 1, world_size=4, silent_s=10, now=now) == [1]
    assert silent_ranks(tmp_path, 1, world_size=4, silent_s=30, now=now) == []
    announce_exit(tmp_path, 1, 0, 76, silent=[1])
    announced = json.loads((folder / "rank-0.exit.json").read_text())
    assert (announced["exit_code"], announced["silent_ranks"]) == (76, [1])
    announce_exit(tmp_path, 1, 2, 0)
    assert "silent_ranks" not in json.loads((folder / "rank-2.exit.json").read_text())


@pytest.mark.slurm
def test_a_stalled_rank_fails_the_job_and_why_shows_its_stack(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    train = {"steps": 1000, "log_every": 1, "hang_timeout_s": TIMEOUT_S}
    exp = synth_experiment(tmp_path, {"name": "hang", "max_restarts": 1, "spare_nodes": 1}, train)
    started = time.monotonic()
    job = submit_json(*TWO_NODES, "--time", "5", str(exp), "--",
                      sys.executable, str(HANG_RANK), "1", "3",
                      cwd=tmp_path, in_process=True)  # fmt: skip
    run = Path(job["run_dir"])
    # The hang is a failure the job restarts from (job.max_restarts=1), in place on the
    # spare node instead of the stalled rank's; rank 1 stalls there too, and then the job
    # is left failed.
    assert wait_final(job["job_id"], 300) == "FAILED"
    took = time.monotonic() - started
    (_, _, first), (_, _, second) = starts(run)
    first_hang = json.loads((run / "heartbeat" / "r0" / "hang.json").read_text())
    assert first_hang["host"] in hostnames(first) and first_hang["host"] not in hostnames(second)
    events = (run / "events").read_text()
    assert (
        f"restarting in place after failure (a hang, exit {EXIT_HANG}) without node "
        f"{first_hang['host']} on {second}: restart 1 of job.max_restarts=1"
    ) in events, events
    assert [line.split()[-1] for line in (run / "attempts").read_text().splitlines()] == [
        "spares=n3", "how=in-place"]  # fmt: skip
    assert scontrol_job(job["job_id"])["Restarts"] == "0"
    wait_for(lambda: not job_processes(run), 60, "the job's processes to be gone")
    assert "not restarted after failure (a hang" in events

    logs = {r: (run / "logs" / "r1" / f"rank-{r}.log").read_text() for r in (0, 1)}
    hang = json.loads((run / "heartbeat" / "r1" / "hang.json").read_text())
    assert (hang["rank"], hang["phase"], hang["step"], hang["gone"]) == (1, "data", 3, False)
    # Rank 0 waited for it in a collective: HSDP's gradient all-reduce across the nodes
    # (in backward), or the step's.
    assert hang["ranks"]["0"]["phase"] in ("forward", "backward", "sync")
    assert hang["stalled_s"] >= TIMEOUT_S
    # Every rank dumped its stacks; the stalled one shows where it stalled.
    for rank, text in logs.items():
        assert f"{STACK_HEADER} {rank} " in text, text[-2000:]
    assert "stall_in_data" in logs[1].split(f"{STACK_HEADER} 1 ")[1]
    # py-spy (a dev dependency) adds the C frames: the sleep the stalled rank is in.
    native = logs[1].split(f"{PY_SPY_HEADER} 1:")[1]
    assert "stall_in_data" in native and "sleep" in native, native[:2000]
    print(f"\nhang detected twice and the job failed {took:.0f} s after submit "
          f"(stalled {hang['stalled_s']:.1f} s at detection)")  # fmt: skip

    why = stoker("why", job["job_id"], "--json")
    assert why.returncode == 0, why.stderr
    diagnosis = json.loads(why.stdout)
    assert diagnosis["cause"] == "hung" and diagnosis["failing_rank"] == 1
    assert "rank 1" in diagnosis["summary"] and "phase 'data' at step 3" in diagnosis["summary"]
    assert any("stall_in_data" in line for line in diagnosis["evidence"])
    assert "data source" in diagnosis["fix"]


RECORDED_DUMP = """step 2/1000  loss 2.7
stoker: Python stacks of rank 1 (n2), phase 'data', step 3:
Current thread 0x00007f51489876c0 (most recent call first):
  File "/x/stoker/runtime/heartbeat.py", line 210 in _dump_and_exit

Thread 0x00007f51497cab80 (most recent call first):
  File "/x/tests/faults/hang_rank.py", line 20 in stall_in_data
  File "/x/stoker/runtime/trainer.py", line 290 in train
"""


def test_why_judges_a_watchdog_report_with_the_stack() -> None:
    from stoker.launcher.why import JobFacts, judge

    hang = {"rank": 1, "host": "n2", "phase": "data", "step": 3, "stalled_s": 301.0,
            "gone": False, "message": "rank 1 (n2) stalled in phase 'data' at step 3 for "
            "301 s (train.hang_timeout_s=300)", "ranks": {"0": {"phase": "sync"},
                                                          "1": {"phase": "data"}}}  # fmt: skip
    facts = JobFacts(job_id="77", state="FAILED", exit_code=EXIT_HANG, hang=hang,
                     rank_logs={1: RECORDED_DUMP})  # fmt: skip
    diagnosis = judge(facts)
    assert diagnosis.cause == "hung" and diagnosis.failing_rank == 1
    assert diagnosis.summary.startswith("the hang watchdog failed the job: rank 1 (n2)")
    assert "ranks by phase: sync: 0; data: 1" in diagnosis.evidence
    stack = "\n".join(diagnosis.evidence)
    assert "stall_in_data" in stack and "_dump_and_exit" not in stack  # the watchdog's own
    gone = judge(JobFacts(job_id="78", state="FAILED", hang={**hang, "gone": True}))
    assert "kernel log" in (gone.fix or "")
