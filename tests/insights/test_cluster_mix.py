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
from concurrent.futures import ThreadPoolExecutor
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
    link_synthetic_data,
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
    slurm_cluster: ClusterSettings, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    names = list(slurm_cluster.node_names)
    link_synthetic_data(tmp_path_factory, *FAST)
    # Where each runs, so that only X can gather incidents: the killed job away from the
    # last node, the requeued job on it alone. Each of them is one rank, which no
    # straggler check can single out (seen, with two ranks on a loaded VM: one of them
    # taken for a straggler on its node, X in 4 incidents when the requeued job ran there).
    last = names[-1]
    with ThreadPoolExecutor(2) as pool:  # each `stoker submit` is a process; side by side
        # 1. killed: one node, one task; SIGKILL after its first checkpoint committed.
        killed_submit = pool.submit(
            submit_json, TINY, *FAST, "train.steps=40", "train.log_every=5",
            "checkpoint.every=5", "job.max_restarts=1", f"job.exclude={last}", "--nodes", "1",
            "--ntasks-per-node", "1", "--time", "10", cwd=tmp_path,
        )  # fmt: skip
        # 5. requeued: from the start, it has the longest way to go.
        requeued_submit = pool.submit(
            submit_json, TINY, *FAST, "train.steps=2000", "train.log_every=5",
            "checkpoint.every=5", "job.max_requeues=1", "job.stop_grace=60",
            f"job.exclude={','.join(_others(names, last))}", "--nodes", "1",
            "--ntasks-per-node", "1", "--time", "10", cwd=tmp_path,
        )  # fmt: skip
        killed, requeued = killed_submit.result(), requeued_submit.result()
    killed_dir, requeued_dir = Path(killed["run_dir"]), Path(requeued["run_dir"])
    wait_for(lambda: scontrol_job(killed["job_id"]).get("JobState") == "RUNNING", 300,
             "the killed job to start")  # fmt: skip
    x = scontrol_job(killed["job_id"])["NodeList"]

    # 2. The rest, submitted while those two run: the straggler and the hang on X, the
    # stall elsewhere. The straggler first: it shares X with the killed job (a CPU each),
    # the hang takes both of X's CPUs once they have left.
    def the_rest() -> tuple[dict, dict, dict]:
        y = _others(names, x)[0]  # neither X nor the last node
        straggler = _wrapped(tmp_path, "straggler",
                             {"slow": [sorted([x, y]).index(x), SLOW_S, 3, 7]}, steps=6, nodes=2,
                             exclude=last)  # fmt: skip
        with ThreadPoolExecutor(2) as pool:
            hang = pool.submit(_wrapped, tmp_path, "hang", {"hang": [1, 3]}, steps=200, nodes=1,
                               tasks=2, exclude=",".join(_others(names, x)),
                               hang_timeout_s=HANG_TIMEOUT_S)  # fmt: skip
            stall = pool.submit(_wrapped, tmp_path, "stall", {"data_stall": [4, DATA_STALL_S]},
                                steps=8, nodes=1, exclude=x)  # fmt: skip
            return straggler, hang.result(), stall.result()

    with ThreadPoolExecutor(1) as pool:
        submitted = pool.submit(the_rest)
        wait_for(lambda: max(committed_steps(killed_dir), default=0) >= 5, 300, "a commit")
        pid, node = rank_pid(killed_dir, 0, 0)
        assert node == x, (node, x)
        killed_at = time.time()
        kill_task(killed["job_id"], x, pid)

        wait_for(lambda: max(committed_steps(requeued_dir), default=0) >= 5, 300, "a commit")
        requeued_at = time.time()
        subprocess.run(["scontrol", "requeue", requeued["job_id"]], check=True,
                       capture_output=True)  # fmt: skip
        wait_for(lambda: len(starts(requeued_dir)) == 2, 300, "the requeued job's second start")
        second_start = starts(requeued_dir)[1][0]
        # Its limit drops to a minute: SLURM's USR2 (stop_grace 60 s before it) is due at once.
        subprocess.run(["scontrol", "update", f"JobId={requeued['job_id']}", "TimeLimit=1"],
                       check=True, capture_output=True)  # fmt: skip
        straggler, hang, stall = submitted.result()

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
