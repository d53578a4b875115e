"""How a rank's process ends after a lost peer (issue [4/8], clean exits): two real
runtime ranks over gloo; one freezes inside the write of a checkpoint while the
other's async save of it waits for it in the checkpoint group's collective (30-minute
timeout: a legitimately slow peer's upload). Either the survivor's next training
collective times out, or (the save at the last step) it waits for the save itself and
its wait ends once the frozen rank's heartbeat has been silent for the collective
timeout (rank 0 watches rank 1, rank 1 watches rank 0): exit 76, a lost peer, either
way. Its process must end then, not when the save's collective gives up, or the job's
step never ends and its restart waits half an hour. The checkpoint stays
uncommitted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from stoker.protocol import EXIT_PEER_LOST
from tests.mlflow_server import free_port

REPO = Path(__file__).resolve().parents[3]
STOP_IN_SAVE = REPO / "tests" / "faults" / "stop_in_save_rank.py"
TIMEOUT_S = 5  # train.collective_timeout_s: its least


@pytest.mark.parametrize(
    ("steps", "hang_timeout_s", "frozen", "said"),
    [
        (40, 0, 1, "Timed out waiting"),  # rank 0 trains on: a step's collective
        # The last save: the other rank waits for it, until the frozen one has been
        # silent for three heartbeats (5 s apart), well before its own hang watchdog
        # (60 s) would fire. Rank 0 watches every rank; the others watch rank 0.
        (4, 60, 1, "rank 1 went silent (no heartbeat"),
        (4, 60, 0, "rank 0 went silent (no heartbeat"),
    ],
    ids=["in-a-step", "waiting-for-the-save", "rank-0-frozen-waiting-for-the-save"],
)
def test_a_rank_whose_peer_froze_in_a_save_exits_at_its_lost_peer(
    tmp_path: Path,
    synthetic_av_set: Callable[..., Path],
    steps: int,
    hang_timeout_s: float,
    frozen: int,
    said: str,
) -> None:
    survivor = 1 - frozen
    data = synthetic_av_set(clips=8, size=(32, 32))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = run_dir / "config.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"url": str(data), "batch_size": 2, "num_workers": 0, "prefetch_mb": 1},
        "train": {"steps": steps, "log_every": 1, "collective_timeout_s": TIMEOUT_S,
                  "hang_timeout_s": hang_timeout_s, "precision": "fp32"},
        "checkpoint": {"every": 2, "keep_last": 5},
        "tracking": {"uri": "none"},  # metrics.jsonl: no MLflow import in the ranks
    }))  # fmt: skip
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "STOKER_RUN"))}
    base.update(OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE="2", STOKER_RUN_DIR=str(run_dir), STOKER_CONFIG=str(config),
                PYTHONPATH=str(REPO))  # fmt: skip
    ranks = []
    for rank in (0, 1):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        log = (run_dir / f"rank-{rank}.log").open("w")
        ranks.append(subprocess.Popen([sys.executable, str(STOP_IN_SAVE), str(frozen), "4"], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path))  # fmt: skip
    try:
        log = run_dir / f"rank-{survivor}.log"
        deadline = time.monotonic() + 240
        while "a collective lost a peer" not in log.read_text():
            assert ranks[survivor].poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        # It said so; now its process ends (its save of step-4 still waits for the other).
        code = ranks[survivor].wait(timeout=60)
        assert code == EXIT_PEER_LOST, log.read_text()[-3000:]
        assert said in log.read_text(), log.read_text()[-3000:]
        exit_file = run_dir / "heartbeat" / "r0" / f"rank-{survivor}.exit.json"
        announced = json.loads(exit_file.read_text())
        assert announced["exit_code"] == EXIT_PEER_LOST
        assert ranks[frozen].poll() is None  # still frozen in the write
        assert not (run_dir / "checkpoints" / "step-4" / "COMMIT.json").exists()
    finally:
        for proc in ranks:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
