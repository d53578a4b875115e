"""Stragglers on the real cluster (`stoker submit`, two nodes, one task each)
with the real runtime over gloo: after a first log window of start-up, rank 1 sleeps in
its data iterator for a window, then inside its forward. The MLflow run names
rank 1 slowest in both windows, with its data wait telling the two apart, and
tags its node; progress.json carries it, and `stoker status` flags it. Then `stoker
status`'s flag alone, from progress.json fixtures, around STRAGGLER_RATIO."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from stoker.launcher.jobs.ledger import Ledger
from stoker.launcher.jobs.targets import select_jobs
from stoker.launcher.watch.status import collect_status
from stoker.protocol import STRAGGLER_RATIO
from tests.clirun import stoker
from tests.faults.training_jobs import TWO_NODES, rank_pid, synth_experiment
from tests.launcher_jobs import local_job, submit_json, wait_final

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

STRAGGLER_RANK = Path(__file__).with_name("straggler_rank.py")
SLEEP_S = 0.4  # per step on rank 1; a tiny step takes ~0.1 s here
WINDOW = 2  # train.log_every: steps 1-2 start up, 3-4 a slow loader, 5-6 a slow forward


@pytest.mark.slurm
def test_a_slow_rank_is_named_in_mlflow_progress_and_status(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    exp = synth_experiment(tmp_path, {"name": "straggler"},
                           {"steps": 3 * WINDOW, "log_every": WINDOW})  # fmt: skip
    started = time.monotonic()
    rank_main = [sys.executable, str(STRAGGLER_RANK), "1", str(SLEEP_S), str(WINDOW)]
    job = submit_json(
        *TWO_NODES, "--time", "5", str(exp), "--", *rank_main, cwd=tmp_path, in_process=True
    )
    run = Path(job["run_dir"])
    state = wait_final(job["job_id"], 240)
    took = time.monotonic() - started
    log = (run / "logs" / "r0" / "rank-0.log").read_text()
    assert state == "COMPLETED", log[-3000:]
    host = rank_pid(run, 0, 1)[1]  # rank 1's node
    assert host in slurm_cluster.node_names

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{os.environ['STOKER_HOME']}/mlflow/mlflow.db")

    def history(key: str) -> dict[int, float]:
        return {m.step: m.value for m in client.get_metric_history(job["run_id"], key)}

    slow_loader, slow_forward = 2 * WINDOW, 3 * WINDOW
    assert history("system/stragglers/slowest_rank").keys() == {WINDOW, slow_loader, slow_forward}
    ratio = history("system/stragglers/slowest_ratio")
    low, median, high = (history(f"system/stragglers/step_s_{k}") for k in ("min", "median", "max"))
    for step in (slow_loader, slow_forward):
        assert history("system/stragglers/slowest_rank")[step] == 1.0
        assert ratio[step] > STRAGGLER_RATIO, ratio
        # Rank 0's own time leaves out its waits for rank 1 (FSDP's all-gathers, the
        # step's all-reduce): rank 1's sleep is not in it.
        assert low[step] < SLEEP_S <= high[step], (low, high)
        assert high[step] / median[step] == pytest.approx(ratio[step])
    # Its data wait tells a slow loader from a slow forward.
    data_wait = history("system/stragglers/slowest_data_wait_s")
    assert data_wait[slow_loader] >= SLEEP_S and data_wait[slow_forward] < SLEEP_S / 2, data_wait
    assert client.get_run(job["run_id"]).data.tags["stoker.slowest_host"] == host

    progress = json.loads((run / "progress.json").read_text())
    assert (progress["slowest_rank"], progress["slowest_host"]) == (1, host)
    assert progress["slowest_ratio"] == pytest.approx(ratio[slow_forward])
    assert f"straggler: rank 1 on {host}" in log  # rank 0's line per log step

    result = stoker("status", job["job_id"], "--json")
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["straggler"] is True and row["straggler_cause"] == "compute"
    assert (row["slowest_rank"], row["slowest_host"]) == (1, host)
    table = stoker("status", job["job_id"])
    assert f"r1@{host} {progress['slowest_ratio']:.2f}x compute" in table.stdout, table.stdout
    print(f"\n2 ranks, 6 steps, rank 1 {SLEEP_S} s slower a step from step 3: {took:.0f} s "
          f"from submit to the end; ratios {ratio}")  # fmt: skip


def _job(ledger: Ledger, tmp_path: Path, job_id: str, progress: dict[str, Any]) -> None:
    run_dir = local_job(ledger, tmp_path, job_id, {"state": "COMPLETED", "exit_code": 0})
    (run_dir / "progress.json").write_text(json.dumps({"step": 40, "total_steps": 100, **progress}))


def _slowest(ratio: float, data_wait_s: float) -> dict[str, Any]:
    """The runtime's record of a 4-rank window whose median rank takes 1 s a step."""
    return {
        "slowest_rank": 3,
        "slowest_host": "gpu-07",
        "slowest_ratio": ratio,
        "slowest_step_s": ratio,
        "median_step_s": 1.0,
        "slowest_data_wait_s": data_wait_s,
        "median_data_wait_s": 0.05,
    }


def test_status_flags_a_rank_slower_than_the_ratio(tmp_path: Path) -> None:
    ledger = Ledger()
    _job(ledger, tmp_path, "local-1", _slowest(1.5, data_wait_s=0.45))  # the loader
    _job(ledger, tmp_path, "local-2", _slowest(1.5, data_wait_s=0.05))  # the node
    _job(ledger, tmp_path, "local-3", _slowest(STRAGGLER_RATIO, data_wait_s=0.05))  # at it
    _job(ledger, tmp_path, "local-4", {})  # one rank: nothing to compare
    # A 4-step job: its steps are mostly the ranks' start-up, too few to judge.
    _job(ledger, tmp_path, "local-5", {**_slowest(1.5, 0.05), "step": 4, "start_step": 0})
    rows = {r.job_id: r for r in collect_status(select_jobs(ledger), ledger).rows}
    flags = {
        job_id: (r.straggler, r.slowest_rank, r.slowest_host, r.straggler_cause)
        for job_id, r in rows.items()
    }
    assert flags == {
        "local-1": (True, 3, "gpu-07", "data"),
        "local-2": (True, 3, "gpu-07", "compute"),
        "local-3": (False, 3, "gpu-07", None),
        "local-4": (False, None, None, None),
        "local-5": (False, 3, "gpu-07", None),
    }

    result = stoker("status", "--json")
    assert result.returncode == 0, result.stderr
    by_id = {row["job_id"]: row for row in json.loads(result.stdout)}
    assert [by_id[j]["straggler"] for j in sorted(by_id)] == [True, True, False, False, False]
    assert by_id["local-1"]["slowest_ratio"] == 1.5
    plain = {line.split()[0]: line for line in stoker("status").stdout.splitlines()}
    assert "STRAGGLER" in plain["JOB"]
    assert "r3@gpu-07 1.50x data" in plain["local-1"]
    assert "r3@gpu-07 1.50x compute" in plain["local-2"]
    assert "gpu-07" not in plain["local-3"] + plain["local-4"] + plain["local-5"]
    assert f"{STRAGGLER_RATIO}x" in stoker("status", "--help").stdout  # the help says the ratio
