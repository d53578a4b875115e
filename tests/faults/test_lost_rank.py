"""A lost rank on the real cluster, with the real runtime: a task SIGKILLed, a task
SIGSTOPped, and a whole node frozen (its slurmd, step daemons and tasks stopped, as a
hung kernel or a dropped network). The job never hangs: the other rank fails within
train.collective_timeout_s, and the job starts again inside its allocation (a new
step; a spare node, job.spare_nodes, for the node that failed), resumes from its last
committed checkpoint, and MLflow holds every step once. SLURM never requeues it: its
Restarts stay 0 and its StartTime is the first start's."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.clirun import stoker
from tests.cluster import localslurm
from tests.faults.training_jobs import (
    FAST,
    TINY,
    TWO_NODES,
    committed_steps,
    event,
    events_of,
    hostnames,
    job_processes,
    kill_task,
    link_synthetic_data,
    loss_history,
    rank_pid,
    resumed_step,
    starts,
)
from tests.launcher_jobs import (
    JOBS,
    run_story,
    scontrol_job,
    submit_json,
    wait_final,
    wait_for,
)

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

pytestmark = pytest.mark.slurm
TIMEOUT_S = 20  # train.collective_timeout_s in these tests (the default is 120)
FROZEN_TIMEOUT_S = 10  # the frozen-node test's: under the local cluster's SlurmdTimeout (20 s)
# Two faults, each after a checkpoint of the attempt it hits, with steps to spare: under
# scripts/cpu-burner a 60-step job ran 42 steps between the test seeing its first commit
# and its kill's srun landing, and finished first.
STEPS = 100
# The tests' jobs (fp32: their losses are compared with an uninterrupted run's).
COMMON = [TINY, *FAST, f"train.steps={STEPS}", "train.log_every=5", "checkpoint.every=5",
          "checkpoint.keep_last=100", f"train.collective_timeout_s={TIMEOUT_S}",
          "train.precision=fp32", "--time", "10"]  # fmt: skip


def _submit(factory: pytest.TempPathFactory, tmp_path: Path, *extra: str) -> tuple[dict, Path]:
    link_synthetic_data(factory, *FAST)
    job = submit_json(
        *COMMON, "job.max_restarts=1", *TWO_NODES, *extra, cwd=tmp_path, in_process=True
    )
    return job, Path(job["run_dir"])


@pytest.fixture(scope="module")
def straight_losses(
    slurm_cluster: ClusterSettings, tmp_path_factory: pytest.TempPathFactory
) -> list[tuple[int, float]]:
    """The losses of the tests' job run without a fault: two ranks on one node (the
    same arithmetic as on two: gloo on CPU, fp32, the same seed and data)."""
    home = tmp_path_factory.mktemp("straight-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(home))
        env.setenv("STOKER_HOME", str(home / ".stoker"))
        link_synthetic_data(tmp_path_factory, *FAST)
        job = submit_json(
            *COMMON, "--nodes", "1", "--ntasks-per-node", "2", cwd=home, in_process=True
        )
        assert wait_final(job["job_id"], 300, Path(job["run_dir"])) == "COMPLETED"
        losses = loss_history(job["run_id"])
    assert [step for step, _ in losses] == list(range(5, STEPS + 1, 5))
    return losses


def _newest_commit(run_dir: Path) -> int:
    return max(committed_steps(run_dir), default=0)


def _check_resumed_and_logged_once(
    job: dict, run_dir: Path, lost: str, at_loss: int, straight: list[tuple[int, float]]
) -> None:
    total = STEPS
    (_, _, first), (_, restart, second) = starts(run_dir)
    assert restart == 1 and lost in hostnames(first) and lost not in hostnames(second), (
        first, second)  # fmt: skip
    commits = committed_steps(run_dir)
    newest = max(s for s, at in commits.items() if at < starts(run_dir)[1][0] + 1)
    assert resumed_step(run_dir, 1) == newest >= at_loss, (
        run_dir / "logs/r1/rank-0.log"
    ).read_text()
    assert f"finished at step {total}" in (run_dir / "logs/r1/rank-0.log").read_text()
    assert loss_history(job["run_id"]) == straight, (
        "every step once, bit-equal to a run without faults"
    )
    status = json.loads(stoker("status", job["job_id"], "--json", check=True).stdout)[0]
    assert status["state"] == "COMPLETED" and status["restarts"] == 1


def _check_never_requeued(job: dict, run_dir: Path) -> None:
    """Every attempt a step of the first allocation: SLURM's Restarts 0, StartTime the
    first attempt's, and no process of the job left on any node."""
    record = scontrol_job(job["job_id"])
    assert record["Restarts"] == "0", record
    first_at = starts(run_dir)[0][0]
    started = time.mktime(time.strptime(record["StartTime"], "%Y-%m-%dT%H:%M:%S"))
    assert abs(started - first_at) <= 2, (record["StartTime"], first_at)
    assert [how for how in _attempt_kinds(run_dir)][1:] == ["in-place"] * (len(starts(run_dir)) - 1)
    wait_for(lambda: not job_processes(run_dir), 60, "the job's processes to be gone")


def _attempt_kinds(run_dir: Path) -> list[str]:
    """The `how=` of each line of the batch script's `attempts`."""
    lines = (run_dir / "attempts").read_text().splitlines()
    return [dict(f.split("=", 1) for f in line.split()[1:])["how"] for line in lines]


def test_a_killed_task_goes_to_the_spare_and_a_stopped_rank_restarts_in_place(
    slurm_cluster: ClusterSettings,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    straight_losses: list[tuple[int, float]],
) -> None:
    """job.spare_nodes=1 on 2+1 nodes. Attempt 0: rank 1 SIGKILLed (srun ends rank 0 at
    once): attempt 1 runs in place on the spare instead of its node. Attempt 1: rank 1
    SIGSTOPped, its node healthy, no spare left (rank 0's collective times out, it exits
    76, a lost rank, no node blamed): attempt 2 in place on the same nodes."""
    job, run_dir = _submit(tmp_path_factory, tmp_path, "job.max_restarts=2", "job.spare_nodes=1")
    wait_for(lambda: _newest_commit(run_dir) >= 5, 240, "a first checkpoint committed")
    pid, node = rank_pid(run_dir, 0, 1)
    first_loss = _newest_commit(run_dir)
    killed_at = time.time()
    kill_task(job["job_id"], node, pid)

    wait_for(lambda: _newest_commit(run_dir) > first_loss, 240, "a commit by attempt 1")
    # While it runs, `stoker status` tells the restart and what it cost.
    running = json.loads(stoker("status", job["job_id"], "--json", check=True).stdout)[0]
    assert running["state"] == "RUNNING" and running["restarts"] == 1, running
    assert running["spares"] is None, running  # the spare took the killed task's place
    cost = (rf"restarted in place without {node} after '{node}: task 1: Killed' "
            r"\((\d+) s to the first step\)")  # fmt: skip
    assert re.fullmatch(cost, running["reason"] or ""), running
    stopped_pid, stopped_node = rank_pid(run_dir, 1, 1)
    second_loss = _newest_commit(run_dir)
    stopped_at = time.time()
    kill_task(job["job_id"], stopped_node, stopped_pid, signal="STOP")

    state = wait_final(job["job_id"], 300, run_dir)
    assert state == "COMPLETED", run_story(run_dir)
    (_, _, first), (_, _, second), (_, _, third) = starts(run_dir)
    assert node in hostnames(first) and node not in hostnames(second) | hostnames(third)
    assert second == third and stopped_node in hostnames(third), (second, third)
    # The events by what they say: each restart's line, whatever else the script noted.
    restart_1 = event(run_dir, r"restarting .*after failure .*restart 1 of job\.max_restarts=2$")
    restart_2 = event(run_dir, r"restarting .*after failure .*restart 2 of job\.max_restarts=2$")
    assert restart_1.text == (
        f"restarting in place after failure ({node}: task 1: Killed, exit 137) without node "
        f"{node} on {second}: restart 1 of job.max_restarts=2")  # fmt: skip
    # srun --kill-on-bad-exit ends the other rank at once, well inside the timeout; the
    # next attempt's first step soon after (the JSON of benchmarks/faults.py has the parts).
    assert restart_1.at - killed_at < TIMEOUT_S, (killed_at, restart_1)
    # Rank 0 exits 76; srun's own status is 76, or 143 when it ended the stopped rank
    # first (SIGCONT, SIGTERM), or 137 when SLURM cancelled the step while rank 0 was
    # on its way out (KILL after KillWait), or the script gave up the step: the 76 it
    # announced names the lost rank, and no node is left out (no spare is left).
    assert re.fullmatch(r"restarting in place after failure \(a lost rank, exit (76|137|143)\) "
                        rf"on {third}: restart 2 of job\.max_restarts=2", restart_2.text), (
        restart_2, _second_start_record(run_dir))  # fmt: skip
    exit_file = run_dir / "heartbeat/r1/rank-0.exit.json"
    announced = json.loads(exit_file.read_text()) if exit_file.exists() else {}
    if announced.get("exit_code") == 76:
        # It names the rank it waited on: SLURM's kill of it is no node fault.
        assert announced["silent_ranks"] == [1], announced
    assert TIMEOUT_S - 2 < restart_2.at - stopped_at < TIMEOUT_S + 30, (stopped_at, restart_2)
    survivor = (run_dir / "logs/r1/rank-0.log").read_text()
    if "Timed out waiting" in survivor:
        assert "a collective lost a peer" in survivor
    else:
        # Seen once in CI on a loaded machine: SLURM cancelled the step 15 s after the
        # stop, before rank 0's timeout, and KILLed rank 0 after KillWait. The stopped
        # rank, continued, then found its peer gone: a lost rank all the same.
        assert "CANCELLED AT" in survivor, survivor
        assert "a collective lost a peer" in (run_dir / "logs/r1/rank-1.log").read_text()

    # Each attempt resumed from the newest checkpoint committed before it began (a commit
    # may land between the test's look and its signal on a loaded machine; the attempts'
    # times are whole seconds, and no rank of the failed attempt commits after it).
    commits = committed_steps(run_dir)
    newest = [
        max(s for s, at in commits.items() if at < began + 1) for began, _, _ in starts(run_dir)[1:]
    ]
    assert [resumed_step(run_dir, 1), resumed_step(run_dir, 2)] == newest, commits
    assert newest[0] >= first_loss and newest[1] >= second_loss
    assert f"finished at step {STEPS}" in (run_dir / "logs/r2/rank-0.log").read_text()
    losses = loss_history(job["run_id"])
    assert losses == straight_losses, "every step once, bit-equal to a run without faults"
    status = json.loads(stoker("status", job["job_id"], "--json", check=True).stdout)[0]
    assert status["state"] == "COMPLETED" and status["restarts"] == 2
    why = json.loads(stoker("why", job["job_id"], "--json", check=True).stdout)
    told = [line for line in why["evidence"] if "restarted in place" in line]
    assert len(told) == 2 and re.search(cost, told[0]), why["evidence"]
    print(
        f"\nkilled task: first step of the next attempt {re.search(cost, told[0])[1]} s "  # type: ignore[index]
        f"after the restart was decided, {restart_1.at - killed_at:.0f} s after the kill"
    )
    _check_never_requeued(job, run_dir)


def _second_start_record(run_dir: Path) -> str:
    """What the batch script judged start 1 from: srun's lines, the ranks' exit files,
    heartbeats and log tails (for a failure's report)."""
    batch = (run_dir / "logs" / "batch.log").read_text()
    parts = [batch[batch.find("stoker: start restart=1 ") :][:4000]]
    for path in sorted((run_dir / "heartbeat" / "r1").glob("rank-*.json")):
        parts.append(f"{path.name}: {path.read_text()}")
    for path in sorted((run_dir / "logs" / "r1").glob("rank-*.log")):
        parts.append(f"{path.name}: ...{path.read_text()[-1500:]}")
    return "\n".join(parts)


def test_frozen_node_fails_the_job_within_the_timeout_and_it_resumes_elsewhere(
    slurm_cluster: ClusterSettings,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    straight_losses: list[tuple[int, float]],
) -> None:
    if slurm_cluster.external:
        pytest.skip("freezing a node needs the local cluster, whose nodes are processes here")
    # The collective's timeout, not SLURM's, must fail the step: a real cluster's SLURM
    # marks a silent node down after SlurmdTimeout (300 s by default), the local one's
    # after 20 s, as soon as a collective of TIMEOUT_S (20 s) would time out. Measured
    # at TIMEOUT_S: in 1 of 3 fresh clones SLURM killed rank 0 before its timeout said so.
    # Frozen just after a commit: often (under load) while its part of the next async
    # save is in flight, so rank 0 may wait on it in the checkpoint's own process group
    # (30 minutes: a slow upload is no fault), a wait that ends once the frozen rank's
    # heartbeat has been silent for the collective timeout (job_checkpointer.peers_gone_for).
    timeout = FROZEN_TIMEOUT_S
    job, run_dir = _submit(tmp_path_factory, tmp_path, "job.spare_nodes=1",
                           f"train.collective_timeout_s={timeout}")  # fmt: skip
    wait_for(lambda: _newest_commit(run_dir) >= 5, 240, "a first checkpoint committed")
    _, node = rank_pid(run_dir, 0, 1)  # not the batch script's node: the script lives on
    at_loss = _newest_commit(run_dir)
    frozen_at = time.time()
    frozen = localslurm.freeze_node(node)
    try:
        survivor = run_dir / "logs" / "r0" / "rank-0.log"
        # In a step's collective ("Timed out waiting"), or waiting for a save in flight
        # ("went silent": its heartbeat, 5 s apart, silent for 3 of them), exit 76.
        wait_for(lambda: "a collective lost a peer" in survivor.read_text(), timeout + 30,
                 "rank 0's collective to time out")  # fmt: skip
        failed_after = survivor.stat().st_mtime - frozen_at
        assert re.search("Timed out waiting|went silent", survivor.read_text())
        assert timeout - 2 < failed_after < timeout + 15, failed_after
        # The script gives up the step whose frozen node's task never ends, and starts
        # the next attempt on the spare: its first step well before SLURM would even mark
        # the node down (SlurmdTimeout, 300 s by default).
        wait_for(lambda: len(starts(run_dir)) == 2, 120, "the job to start again")
        wait_for(lambda: _first_step_at(run_dir, 1) is not None, 120, "attempt 1's first step")
        recovered_after = _first_step_at(run_dir, 1) - frozen_at  # type: ignore[operator]
        print(f"\nfrozen node: first step of the next attempt {recovered_after:.1f} s after")
        assert recovered_after < timeout + 45, recovered_after
        # The node comes back (as a fenced or rebooted one would): what its frozen rank
        # held is let go, such as the sqlite store's lock if it froze mid-write (seen
        # in CI); the new start's loggers wait that out as an outage, then deliver.
        localslurm.thaw(frozen)
        state = wait_final(job["job_id"], 300, run_dir)
        assert state == "COMPLETED", run_story(run_dir)
    finally:
        localslurm.thaw(frozen)
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"],
                       capture_output=True, check=False)  # fmt: skip
    _check_resumed_and_logged_once(job, run_dir, node, at_loss, straight_losses)
    _check_never_requeued(job, run_dir)
    wait_for(lambda: _node_state(node) in {"IDLE", "MIXED", "ALLOCATED"}, 60, f"{node} back")


def _first_step_at(run_dir: Path, attempt: int) -> float | None:
    """When the attempt's first training step ended (its time account), or None yet."""
    path = run_dir / "accounting" / f"r{attempt}.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        if record["kind"] == "first_step":
            return float(record["at"])
    return None


def _node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], capture_output=True,
                         text=True, check=False).stdout  # fmt: skip
    return out.strip().rstrip("*").upper()


def test_program_errors_and_failures_beyond_max_restarts_are_left_failed(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    # The program's own error would only fail again: not restarted, whatever max_restarts.
    error = submit_json("job.max_restarts=5", "--time", "5", "--", "python3", "-c",
                        "raise SystemExit(3)", cwd=tmp_path, in_process=True)  # fmt: skip
    state = tmp_path / "steps.txt"
    job = submit_json("job.max_restarts=0", "--time", "5", "--", "bash", "-c",
                      f'echo $$ > {tmp_path}/pid; exec python3 {JOBS / "count_steps.py"} '
                      f"{state} 300 0.2", cwd=tmp_path, in_process=True)  # fmt: skip
    wait_for(lambda: state.exists() and len(state.read_text().split()) >= 2, 60, "2 steps")
    run_dir = Path(job["run_dir"])
    node = starts(run_dir)[0][2]
    kill_task(job["job_id"], node, int((tmp_path / "pid").read_text()))
    assert wait_final(job["job_id"], 60) == "FAILED"
    events = (run_dir / "events").read_text()
    assert f"not restarted after failure ({node}: task 0: Killed, exit 137): 0 of " \
           "job.max_restarts=0 restarts used" in events, events  # fmt: skip
    assert len(starts(run_dir)) == 1 and not (run_dir / "failures").exists()
    why = stoker("why", job["job_id"]).stdout
    assert "job.max_restarts=0" in why, why

    assert wait_final(error["job_id"], 60) == "FAILED"
    error_dir = Path(error["run_dir"])
    assert len(starts(error_dir)) == 1 and not (error_dir / "events").exists()


def test_a_node_is_not_left_out_when_the_job_would_no_longer_fit(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """A job on every node of its partition: leaving the failed node out would keep it
    pending for good, so it starts again on all of them (seen in CI as a job pending
    after two restarts had left two of three nodes out)."""
    listing = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %P"], capture_output=True,
                             text=True, check=True).stdout  # fmt: skip
    nodes = sorted({line.split()[0] for line in listing.splitlines() if line.endswith("*")})
    state = tmp_path / "steps.txt"
    job = submit_json(
        "job.max_restarts=1", "--nodes", str(len(nodes)), "--ntasks-per-node", "1", "--time", "5",
        "--", "bash", "-c", f'echo "$$ $SLURMD_NODENAME" > {tmp_path}/rank-$RANK; '
        f"exec python3 {JOBS / 'count_steps.py'} {state} 40 0.2",
        cwd=tmp_path, in_process=True,
    )  # fmt: skip
    last = len(nodes) - 1
    wait_for(lambda: state.exists() and len(state.read_text().split()) >= 2, 60, "2 steps")
    pid, node = (tmp_path / f"rank-{last}").read_text().split()
    kill_task(job["job_id"], node, int(pid))
    assert wait_final(job["job_id"], 240, Path(job["run_dir"])) == "COMPLETED"
    run_dir = Path(job["run_dir"])
    kept = event(run_dir, "^not excluding node ").text
    assert kept == (
        f"not excluding node {node}: {last} usable node(s) would be left in partition "
        f"{scontrol_job(job['job_id'])['Partition']} for a {len(nodes)}-node job"
    )
    # srun's own status: 137, or 143 when it reports a terminated task's. A requeue could
    # not leave the node out either: the next attempt runs in place, on every node.
    restart = rf"restarting in place after failure \({node}: task {last}: Killed, exit (137|143)\) "
    assert re.fullmatch(restart + rf"on {','.join(nodes)}: restart 1 of job\.max_restarts=1",
                        event(run_dir, "^restarting ").text)  # fmt: skip
    assert len(events_of(run_dir)) == 2, events_of(run_dir)
    assert [hostnames(nodelist) for _, _, nodelist in starts(run_dir)] == [set(nodes)] * 2
    assert scontrol_job(job["job_id"]).get("ExcNodeList") in ("(null)", None)
    assert scontrol_job(job["job_id"])["Restarts"] == "0"
    wait_for(lambda: not job_processes(run_dir), 60, "the job's processes to be gone")


def test_without_a_spare_a_killed_tasks_node_is_left_out_by_a_requeue(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """Two nodes of three, no spare: the allocation cannot host the job without the
    killed task's node, so the script requeues the job with that node excluded
    (requeuehold, ExcNodeList, release) and SLURM starts it again on the third. The
    requeued job's step ids start at 0 again: its training step skips the earlier ones,
    and a late kill for step 0 ends nothing of it."""
    state = tmp_path / "steps.txt"
    job = submit_json(
        "job.max_restarts=1", "--nodes", "2", "--ntasks-per-node", "1", "--time", "5",
        "--", "bash", "-c", f'echo "$$ $SLURMD_NODENAME" > {tmp_path}/rank-$RANK; '
        f"exec python3 {JOBS / 'count_steps.py'} {state} 120 0.2",
        cwd=tmp_path, in_process=True,
    )  # fmt: skip
    # 2 of 120 steps (0.2 s each, resumed after the requeue): a loaded machine's kill
    # still lands mid-run (40 steps did not, under scripts/cpu-burner).
    wait_for(lambda: state.exists() and len(state.read_text().split()) >= 2, 60, "2 steps")
    pid, node = (tmp_path / "rank-1").read_text().split()
    kill_task(job["job_id"], node, int(pid))
    run_dir = Path(job["run_dir"])
    wait_for(lambda: len(starts(run_dir)) == 2, 120, "the requeued job to start")
    wait_for(lambda: (tmp_path / "rank-1").read_text().split()[0] != pid, 60, "rank 1 again")
    # A kill for the first allocation's step 0, arriving late (as slurmctld resends one):
    # the requeued job's training step has another id, so nothing of it ends.
    subprocess.run(["scancel", "--signal=KILL", f"{job['job_id']}.0"], capture_output=True,
                   check=False)  # fmt: skip
    assert wait_final(job["job_id"], 240, run_dir) == "COMPLETED"
    assert len((run_dir / "failures").read_text().splitlines()) == 1
    requeued = event(run_dir, "^restarting ").text
    assert re.fullmatch(
        rf"restarting by requeue after failure \({node}: task 1: Killed, exit (137|143)\) "
        rf"without node {node} \(no node of the allocation left to replace it\): "
        r"restart 1 of job\.max_restarts=1", requeued), requeued  # fmt: skip
    (_, _, first), (_, _, second) = starts(run_dir)
    assert node in hostnames(first) and node not in hostnames(second)
    assert _attempt_kinds(run_dir) == ["start", "requeue"]
    record = scontrol_job(job["job_id"])
    assert (record["Restarts"], record["ExcNodeList"]) == ("1", node), record
    wait_for(lambda: not job_processes(run_dir), 60, "the job's processes to be gone")
