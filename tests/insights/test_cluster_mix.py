"""`stoker insights` against the ground truth of a scripted mix of jobs on the real
cluster, with the real runtime:

    killed    a task SIGKILLed on node X after a checkpoint: restarted without X,
              resumed, completed
    hang      two ranks pinned to X (job.exclude): rank 1's data never comes; the
              watchdog fails the job, the ranks' flight recorders name rank 1
    straggler two nodes, X among them: X's rank waits for its data in four steps
    stall     every rank waits DATA_STALL_S for one batch, then completes
    requeued  `scontrol requeue` after a checkpoint; after its second start, a time
              limit with no requeue left: it ends as `stoker why` says

X is the node the first job landed on. It is implicated three times (a killed task,
a hang, a straggler): insights names it, alone, with the drain and exclude advice;
each job's lost time by cause matches what was injected, to a few seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from stoker.job_time import read_lines
from tests.clirun import stoker
from tests.faults.training_jobs import (
    FAST,
    TINY,
    committed_steps,
    kill_task,
    mlflow_client,
    rank_pid,
    starts,
    synth_experiment,
)
from tests.insights.test_insights import check_with_promtool
from tests.launcher_jobs import run_story, scontrol_job, submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
MIX_RANK = Path(__file__).with_name("mix_rank.py")
HANG_TIMEOUT_S = 20  # train.hang_timeout_s of the hang job
DATA_STALL_S = 8.0
SLOW_S = 1.5  # the straggler's wait per step, steps 3-6: two of its three log windows
SLACK_S = 4.0  # "a few seconds": clocks, log-step granularity, a loaded 2-core VM


def _wrapped(tmp_path: Path, name: str, plan: dict[str, Any], *, steps: int, nodes: int,
             exclude: str | None = None, tasks: int = 1, **train: Any) -> dict:  # fmt: skip
    folder = tmp_path / name
    folder.mkdir()
    job = {"name": name, "max_restarts": 0, **({"exclude": exclude} if exclude else {})}
    exp = synth_experiment(folder, job, {"steps": steps, "log_every": 2, **train})
    return submit_json("--nodes", str(nodes), "--ntasks-per-node", str(tasks), "--time", "10",
                       str(exp), "--", sys.executable, str(MIX_RANK), json.dumps(plan),
                       cwd=folder)  # fmt: skip


def _others(nodes: list[str], node: str) -> list[str]:
    return [n for n in nodes if n != node]


def test_insights_match_the_injected_troubles(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    names = list(slurm_cluster.node_names)
    # 1. killed: one node, one task; SIGKILL after step-10 committed.
    killed = submit_json(TINY, *FAST, "train.steps=40", "train.log_every=5",
                         "checkpoint.every=5", "job.max_restarts=1", "--nodes", "1",
                         "--time", "10", cwd=tmp_path)  # fmt: skip
    killed_dir = Path(killed["run_dir"])
    wait_for(lambda: max(committed_steps(killed_dir), default=0) >= 10, 300, "step-10 committed")
    pid, x = rank_pid(killed_dir, 0, 0)
    killed_at = time.time()
    kill_task(killed["job_id"], x, pid)

    # 2. The rest at once: the hang and the straggler on X, the stall and the requeue elsewhere.
    hang = _wrapped(tmp_path, "hang", {"hang": [1, 3]}, steps=200, nodes=1, tasks=2,
                    exclude=",".join(_others(names, x)), hang_timeout_s=HANG_TIMEOUT_S)  # fmt: skip
    pair = sorted([x, _others(names, x)[0]])
    straggler = _wrapped(tmp_path, "straggler", {"slow": [pair.index(x), SLOW_S, 3, 7]},
                         steps=6, nodes=2, exclude=_others(names, x)[1])  # fmt: skip
    # The stall and the requeue run away from X: the requeued job's two ranks share a node
    # with everything else and, on a loaded VM, one of them is seen as a straggler on its
    # node (seen: X in 4 incidents when SLURM placed it there).
    stall = _wrapped(tmp_path, "stall", {"data_stall": [4, DATA_STALL_S]}, steps=8, nodes=1,
                     exclude=x)  # fmt: skip
    requeued = submit_json(TINY, *FAST, "train.steps=2000", "train.log_every=5",
                           "checkpoint.every=5", "job.max_requeues=1", "job.stop_grace=60",
                           f"job.exclude={x}", "--nodes", "1", "--time", "10",
                           cwd=tmp_path)  # fmt: skip
    requeued_dir = Path(requeued["run_dir"])
    wait_for(lambda: max(committed_steps(requeued_dir), default=0) >= 5, 300, "a commit")
    requeued_at = time.time()
    subprocess.run(["scontrol", "requeue", requeued["job_id"]], check=True, capture_output=True)
    wait_for(lambda: len(starts(requeued_dir)) == 2, 300, "the requeued job's second start")
    second_start = starts(requeued_dir)[1][0]
    # Its limit drops to a minute: SLURM's USR2 (stop_grace 60 s before it) is due at once.
    subprocess.run(["scontrol", "update", f"JobId={requeued['job_id']}", "TimeLimit=1"],
                   check=True, capture_output=True)  # fmt: skip

    states = {}
    for job in (killed, hang, straggler, stall, requeued):
        states[job["job_id"]] = wait_final(job["job_id"], 600, Path(job["run_dir"]))
    assert states[killed["job_id"]] == "COMPLETED", run_story(killed_dir)
    assert states[straggler["job_id"]] == "COMPLETED", run_story(Path(straggler["run_dir"]))
    assert states[stall["job_id"]] == "COMPLETED", run_story(Path(stall["run_dir"]))
    assert states[hang["job_id"]] == "FAILED", run_story(Path(hang["run_dir"]))
    assert states[requeued["job_id"]] != "COMPLETED", run_story(requeued_dir)

    prom = tmp_path / "insights.prom"
    result = stoker("insights", "--since", "1h", "--json", "--per-job", "--prometheus", str(prom),
                    timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    jobs = {j["job_id"]: j for j in report["jobs"]}
    assert set(jobs) == set(states), (sorted(jobs), states)
    check_with_promtool(prom)

    for job in jobs.values():
        rank_h = job["allocated_h"]  # CPU jobs of one CPU per rank: rank-hours
        assert job["resource"] == "CPU" and job["per_rank"] == 1.0
        # Every second of the allocation to one cause (sacct's times are whole seconds).
        accounted = job["productive_h"] + sum(job["lost_h"].values())
        assert accounted == pytest.approx(rank_h, abs=2 * 2 / 3600), job
        assert job["partition"] == slurm_cluster.partition and job["starts"] >= 1

    def lost_s(job: dict, cause: str) -> float:
        return jobs[job["job_id"]]["lost_h"][cause] * 3600

    # The killed job: two starts, its killed node named; what its first start did after
    # its last logged window until the kill is lost (redone, or after its last step).
    k = jobs[killed["job_id"]]
    assert k["starts"] == 2 and {"node": x, "kind": "killed task", "restart": 0} in k["nodes"]
    windows = [line for line in read_lines(killed_dir / "accounting" / "r0.jsonl")
               if line["kind"] == "window"]  # fmt: skip
    tail_s = killed_at - windows[-1]["at"]
    assert lost_s(killed, "redone") + lost_s(killed, "after_last_step") >= tail_s - 1
    # The hang: the stall until the watchdog's detection, HANG_TIMEOUT_S and a few
    # seconds, on each of its two ranks; the flight recorder names the rank behind.
    h = jobs[hang["job_id"]]
    assert h["cause"] == "hung" and {"node": x, "kind": "hang", "restart": 0} in h["nodes"]
    assert HANG_TIMEOUT_S - 1 <= lost_s(hang, "hang") / 2 <= HANG_TIMEOUT_S + SLACK_S + 5
    # Its run holds its time account, logged by the launcher that saw it fail.
    hang_run = mlflow_client().get_run(hang["run_id"])
    assert hang_run.data.tags["stoker.goodput"] == f"{h['productive_h'] / h['allocated_h']:.3f}"
    assert hang_run.data.metrics["system/goodput/lost_hang_rank_hours"] == pytest.approx(
        h["lost_h"]["hang"])  # fmt: skip
    evidence = json.loads(stoker("why", hang["job_id"], "--json").stdout)["evidence"]
    recorded = [line for line in evidence if line.startswith("flight recorder")]
    assert recorded and "rank 1 fell behind" in recorded[0] and "ranks 0 wait" in recorded[0], (
        evidence)  # fmt: skip
    # The straggler: X named for its two slow windows (rank 0's data wait is not its).
    s = jobs[straggler["job_id"]]
    assert {"node": x, "kind": "straggler", "restart": None} in s["nodes"], s["nodes"]
    # The stall: DATA_STALL_S more data wait than the loader's own in the other windows.
    windows = [line for line in read_lines(Path(stall["run_dir"]) / "accounting" / "r0.jsonl")
               if line["kind"] == "window"]  # fmt: skip
    own = sum(w["data_s"] for w in windows if not w["step"] - w["steps"] < 4 <= w["step"])
    extra = lost_s(stall, "data_wait") - own
    assert DATA_STALL_S - 0.5 <= extra <= DATA_STALL_S + SLACK_S, (extra, windows)
    # The requeue: waited out SLURM's hold between its starts, measured by the test's clock.
    r = jobs[requeued["job_id"]]
    queue_s = r["queue_after_requeue_h"] * 3600
    assert r["starts"] == 2 and 5 <= queue_s <= second_start - requeued_at + 1, queue_s
    why = json.loads(stoker("why", requeued["job_id"], "--json").stdout)
    assert r["cause"] == why["cause"]

    # Across jobs: X alone in two or more incidents, with what to do.
    assert [n["node"] for n in report["nodes"]] == [x], report["nodes"]
    node = report["nodes"][0]
    assert node["incidents"] == 3 and set(node["jobs"]) == {
        killed["job_id"], hang["job_id"], straggler["job_id"]}, (
        node, {j: jobs[j]["nodes"] for j in jobs})  # fmt: skip
    assert f"NodeName={x} State=DRAIN" in node["advice"]["operators"]
    failures = {f["cause"]: f["jobs"] for f in report["failures"]}
    assert failures.get("hung") == 1 and sum(failures.values()) == 2, failures
    totals = report["totals"]["CPU"]
    assert totals["jobs"] == 5 and 0 < totals["goodput"] < 1
    assert f'stoker_insights_node_incidents{{node="{x}"}} 3.0' in prom.read_text()
    assert scontrol_job(hang["job_id"]).get("JobState") == "FAILED"
