"""The batch script's restart after a failed attempt, run under bash with SLURM's commands
replaced by shims: which node it leaves out, and when it must not; whether it starts
again in place (a new step in the same allocation) or by a requeue. The same decisions
run on the real cluster in tests/faults/test_lost_rank.py and test_hang.py; here the
cases that a real cluster gives only by chance (the order of srun's lines, a partition
too small to leave a node out) are set up exactly."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from stoker.launcher.script.render import render_sbatch
from tests.faults.batch_shim import SCRIPT_TIMEOUT_S, prepare_batch_script, run_batch_script
from tests.launcher.launch_specs import make_spec

JOB_ID = "42"
# srun: the first attempt prints its lines about the tasks (as srun does, to the batch
# script's stderr, which SLURM writes to logs/batch.log) and exits with srun's status,
# or, with $SRUN_HANGS, stays (a frozen node's tasks never end); the attempts after it
# succeed. Each call's --nodelist goes to $CALLS.
SRUN = """#!/bin/bash
n=$(cat "$SRUN_CALLS" 2>/dev/null || echo 0); echo $((n + 1)) >"$SRUN_CALLS"
echo "srun $(printf '%s\\n' "$@" | grep -- '^--nodelist=')" >>"$CALLS"
[ "$n" = 0 ] || exit 0
cat "$SRUN_LINES_FILE" >&2
[ -z "$SRUN_HANGS" ] || exec sleep 600
exit "$SRUN_RC"
"""
# squeue: the allocation's steps, one training step left; scancel: recorded.
SQUEUE = """#!/bin/bash
printf '%s\\n' "$JOB.batch" "$JOB.0"
"""
SCANCEL = """#!/bin/bash
echo "scancel $*" >>"$CALLS"
"""
# scontrol: the questions the script asks, the changes it makes (written to $CALLS).
SCONTROL = """#!/bin/bash
case "$1 $2" in
"show hostnames") tr ',' '\\n' <<<"$3" | grep . ;;
"show node") echo "NodeName=$3 NodeAddr=10.0.0.7" ;;
"show config") echo "KillWait                = ${KILL_WAIT:-5} sec" ;;
"show job") echo "JobId=$JOB JobState=RUNNING NumNodes=$NEED Partition=debug" \\
    "ExcNodeList=$EXCLUDED" ;;
*) echo "scontrol $*" >>"$CALLS" ;;
esac
"""
# sinfo: the job's nodes SLURM has not heard from lately ($NO_RESPOND; none is down);
# the partition's nodes and their states.
SINFO = """#!/bin/bash
if [[ " $* " == *" -p "* ]]; then cat "$PARTITION_FILE"; fi
if [[ " $* " == *" -t no_respond "* ]]; then tr ' ' '\\n' <<<"$NO_RESPOND" | grep .; fi
exit 0
"""


def _run_start(
    tmp_path: Path,
    srun_lines: list[str],
    rc: int,
    partition: list[str],
    need: int = 2,
    excluded: str = "(null)",
    task_logs: dict[int, str] | None = None,
    no_respond: str = "",
    heartbeats: dict[int, float] | None = None,
    announced: dict[int, int] | None = None,
    silent: dict[int, list[int]] | None = None,
    nodelist: str = "n1,n3",
    hosts: dict[int, str] | None = None,
    hangs: bool = False,
    kill_wait: int = 5,
) -> tuple[list[str], list[str]]:
    """One failed attempt of a 2-node job with job.max_restarts=2 on the allocation
    `nodelist` (3 nodes: one spare): (events, the SLURM calls that act: srun, scontrol's
    changes, scancel). Rank r's heartbeat names node hosts[r] (n1 by default)."""
    run_dir = tmp_path / "run"
    spec = make_spec(
        ["job.max_restarts=2"], {"job.nodes": (2, "--nodes")},
        command=["python", "train.py"], run_dir=run_dir, workdir=tmp_path,
    )  # fmt: skip
    (run_dir / "logs" / "r0").mkdir(parents=True)
    for task, text in (task_logs or {}).items():
        (run_dir / "logs" / "r0" / f"rank-{task}.log").write_text(text)
    (run_dir / "heartbeat" / "r0").mkdir(parents=True)
    for task, written_at in (heartbeats or {}).items():
        beat = {"rank": task, "host": (hosts or {}).get(task, "n1"), "pid": 1, "step": 18,
                "phase": "backward", "progress_at": written_at - 16,
                "written_at": written_at}  # fmt: skip
        (run_dir / "heartbeat" / "r0" / f"rank-{task}.json").write_text(json.dumps(beat))
    for task, code in (announced or {}).items():  # as stoker/runtime/observe/heartbeat.py writes it
        exit_file = run_dir / "heartbeat" / "r0" / f"rank-{task}.exit.json"
        record = {"exit_code": code, "written_at": int(CANCEL_TIME)}
        if (silent or {}).get(task):
            record["silent_ranks"] = (silent or {})[task]
        exit_file.write_text(json.dumps(record))
    (tmp_path / "srun-lines").write_text("".join(f"{line}\n" for line in srun_lines))
    (tmp_path / "partition").write_text("".join(f"{line}\n" for line in partition))
    calls = tmp_path / "calls"
    env = {
        "SRUN_LINES_FILE": str(tmp_path / "srun-lines"), "SRUN_RC": str(rc),
        "PARTITION_FILE": str(tmp_path / "partition"), "CALLS": str(calls),
        "JOB": JOB_ID, "NEED": str(need), "EXCLUDED": excluded, "NO_RESPOND": no_respond,
        "SLURMD_NODENAME": "n1",  # the batch script runs on the job's first node
        "SLURM_JOB_ID": JOB_ID, "SLURM_JOB_NODELIST": nodelist, "SLURM_NTASKS": "2",
        "SRUN_CALLS": str(tmp_path / "srun-calls"), "SRUN_HANGS": "1" if hangs else "",
        "KILL_WAIT": str(kill_wait),
    }  # fmt: skip
    batch_log = run_dir / "logs" / "batch.log"
    shims = {"srun": SRUN, "scontrol": SCONTROL, "sinfo": SINFO, "squeue": SQUEUE,
             "scancel": SCANCEL}  # fmt: skip
    result = run_batch_script(render_sbatch(spec).text, tmp_path, env, shims, batch_log)
    assert result.returncode == 0, batch_log.read_text()
    events = [line.split(" ", 1)[1] for line in (run_dir / "events").read_text().splitlines()]
    return events, calls.read_text().splitlines() if calls.exists() else []


THREE_NODES = ["n1 idle", "n2 idle", "n3 idle"]
CANCELLED_AT = "2026-11-21T19:31:55"  # as slurmstepd writes it: the node's local time
CANCELLED = f"slurmstepd-n1: error: *** STEP {JOB_ID}.0 ON n1 CANCELLED AT {CANCELLED_AT} ***"
CANCEL_TIME = time.mktime(time.strptime(CANCELLED_AT, "%Y-%m-%dT%H:%M:%S"))
FIRST = "srun --nodelist=n1,n3"  # the first attempt, on the whole allocation
NO_SPARE = "no node of the allocation left to replace it"


def in_place(failure: str, nodes: str = "n1,n3", without: str = "") -> str:
    """The event of a restart in place, as the script writes it."""
    left_out = f" without node {without}" if without else ""
    return (f"restarting in place after failure ({failure}){left_out} on {nodes}: "
            "restart 1 of job.max_restarts=2")  # fmt: skip


def by_requeue(failure: str, without: str = "", why: str = NO_SPARE) -> str:
    """The event of a restart by requeue."""
    left_out = f" without node {without}" if without else ""
    return (f"restarting by requeue after failure ({failure}){left_out} ({why}): "
            "restart 1 of job.max_restarts=2")  # fmt: skip


# A restart in place: the next step on the nodes kept, after the old one is cancelled.
IN_PLACE_CALLS = [FIRST, f"scancel {JOB_ID}.0", "srun --nodelist=n1,n3"]


def test_a_killed_task_leaves_its_node_out(tmp_path: Path) -> None:
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n3: task 1: Killed", "srun: error: n1: task 0: Exited with exit code 76"],
        rc=137, partition=THREE_NODES, task_logs={0: "step 15/60\n", 1: "step 15/60\n"},
    )  # fmt: skip
    assert events == [by_requeue("n3: task 1: Killed, exit 137", without="n3")]
    assert calls == [FIRST, f"scontrol requeuehold {JOB_ID}",
                     f"scontrol update JobId={JOB_ID} ExcNodeList=n3",
                     f"scontrol release {JOB_ID}"]  # fmt: skip


def test_a_task_slurm_killed_after_cancelling_its_step_blames_no_node(tmp_path: Path) -> None:
    """Rank 0 waited in a collective on a frozen rank 1 when SLURM cancelled the step
    (seen in CI): KILL after KillWait, and srun named it first. Its heartbeat, written
    2 s after the cancel, proves it was alive then; rank 1's exit 76 (a lost peer) is
    what happened."""
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n1: task 0: Killed", "srun: error: n3: task 1: Exited with exit code 76"],
        rc=137, partition=THREE_NODES, excluded="n2",
        task_logs={0: f"step 15/60\n{CANCELLED}\n", 1: "Connection closed by peer\n"},
        heartbeats={0: CANCEL_TIME + 2.2, 1: CANCEL_TIME + 5.3},
    )  # fmt: skip
    assert events == [in_place("a lost rank, exit 137")]
    assert calls == IN_PLACE_CALLS


@pytest.mark.parametrize("rank1", ["Killed", "Exited with exit code 76", None])
def test_a_task_killed_while_it_exited_as_it_said_blames_no_node(
    tmp_path: Path, rank1: str | None
) -> None:
    """The CI failure of issue 17: rank 0 found its peer lost and was exiting 76 (closing
    MLflow) when SLURM cancelled the step and KILLed it; its heartbeat had stopped 16 s
    before the cancel, so only the exit it announced tells it was alive and well. The
    stopped rank 1 was killed too, or exited 76 itself, or srun named no line for it."""
    lines = ["srun: error: n1: task 0: Killed"]
    if rank1 is not None:
        lines.append(f"srun: error: n3: task 1: {rank1}")
    events, calls = _run_start(
        tmp_path, lines, rc=137, partition=THREE_NODES,
        task_logs={0: f"a collective lost a peer; exit 76\n{CANCELLED}\n"},
        heartbeats={0: CANCEL_TIME - 16.0}, announced={0: 76},
    )  # fmt: skip
    assert events == [in_place("a lost rank, exit 137")]
    assert calls == IN_PLACE_CALLS


@pytest.mark.parametrize("rank0", ["Exited with exit code 76", "Killed"])
@pytest.mark.parametrize("silent", [[1], [1, 3], [2, 1]])
def test_a_frozen_rank_killed_by_slurm_is_a_lost_rank_whatever_srun_printed_first(
    tmp_path: Path, rank0: str, silent: list[int]
) -> None:
    """The CI failure of issue 17, again: rank 1 was stopped (SIGSTOP), rank 0's
    collective timed out and it exited 76, naming rank 1 frozen (its heartbeat silent
    for 25 s); SLURM then KILLed rank 1, and srun printed that line first. Rank 1's
    node is not to blame: a lost rank, every node kept."""
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n3: task 1: Killed", f"srun: error: n1: task 0: {rank0}"],
        rc=137, partition=THREE_NODES, task_logs={1: "step 15/60\n"},
        heartbeats={1: CANCEL_TIME - 25.0}, announced={0: 76}, silent={0: sorted(silent)},
    )  # fmt: skip
    assert events == [in_place("a lost rank, exit 137")]
    assert calls == IN_PLACE_CALLS


def test_a_killed_rank_its_peer_did_not_name_frozen_is_its_nodes_fault(tmp_path: Path) -> None:
    """Rank 3 froze, not rank 1 (nor rank 11): rank 1's kill is its node's fault."""
    events, _ = _run_start(
        tmp_path,
        ["srun: error: n3: task 1: Killed", "srun: error: n1: task 0: Exited with exit code 76"],
        rc=137, partition=THREE_NODES, announced={0: 76}, silent={0: [3, 11]},
    )  # fmt: skip
    assert events == [by_requeue("n3: task 1: Killed, exit 137", without="n3")]


def test_a_task_that_announced_success_is_not_the_failure(tmp_path: Path) -> None:
    """Rank 0 had finished (exit 0 announced) when rank 1's node killed rank 1: n3 is
    the node to leave out, whatever order srun printed the lines in."""
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n1: task 0: Killed", "srun: error: n3: task 1: Killed"],
        rc=137, partition=THREE_NODES, announced={0: 0},
    )  # fmt: skip
    assert events == [by_requeue("n3: task 1: Killed, exit 137", without="n3")]
    assert f"scontrol update JobId={JOB_ID} ExcNodeList=n3" in calls


def test_a_step_slurm_cancelled_with_no_task_failing_starts_again_on_any_node(
    tmp_path: Path,
) -> None:
    """Seen in CI on a loaded machine: SLURM cancelled a healthy step (no scancel, no
    task failed first); rank 0 saved on the SIGTERM and exited 143, rank 1 stopped with
    it (75), srun called rank 0 Killed. The program did not fail: start again."""
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n3: task 1: Terminated", "srun: error: n1: task 0: Killed"],
        rc=143, partition=THREE_NODES, task_logs={0: f"step 56/60\n{CANCELLED}\n"},
        heartbeats={0: CANCEL_TIME - 2.0}, announced={0: 143, 1: 75},
    )  # fmt: skip
    assert events == [in_place("its step ended by SLURM, no task failing of its own, exit 143")]
    assert calls == IN_PLACE_CALLS


@pytest.mark.parametrize("written_after_cancel", [0.5, -1.5, None])
def test_a_killed_first_task_of_its_node_is_blamed_though_its_log_says_cancelled(
    tmp_path: Path, written_after_cancel: float | None
) -> None:
    """slurmstepd writes "CANCELLED" into the log of its node's first task, here the
    task that was killed (and made srun cancel the step): its last heartbeat, in the
    second of the cancel or before it (or none: not the runtime), proves nothing, so its
    node is left out. n2's task 2 then died of the cancel, and is not blamed."""
    heartbeats = {} if written_after_cancel is None else {0: CANCEL_TIME + written_after_cancel}
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n1: task 0: Killed", "srun: error: n2: task 2: Killed"],
        rc=137, partition=THREE_NODES, task_logs={0: f"step 15/60\n{CANCELLED}\n"},
        heartbeats={**heartbeats, 2: CANCEL_TIME + 4.0},
    )  # fmt: skip
    # n1 runs this script: no restart in place without it.
    why = "the node to leave out runs this script"
    assert events == [by_requeue("n1: task 0: Killed, exit 137", without="n1", why=why)]
    assert f"scontrol update JobId={JOB_ID} ExcNodeList=n1" in calls


@pytest.mark.parametrize(
    ("partition", "excluded", "left"),
    [(THREE_NODES, "n2", 1),  # n2 left out by an earlier restart
     (["n1 idle", "n2 down*", "n3 mix"], "(null)", 1),  # n2 is down
     (["n1 idle", "n2 drain", "n3 alloc", "n4 fail"], "(null)", 1)],
)  # fmt: skip
def test_a_node_is_not_left_out_when_the_job_would_no_longer_fit(
    tmp_path: Path, partition: list[str], excluded: str, left: int
) -> None:
    """Leaving n3 out would leave one usable node for a 2-node job: SLURM would accept
    the ExcNodeList and keep the job pending for good."""
    events, calls = _run_start(
        tmp_path, ["srun: error: n3: task 1: Killed"], rc=137, partition=partition,
        excluded=excluded, task_logs={1: "step 15/60\n"},
    )  # fmt: skip
    # A requeue could not leave it out either: start again in place, on it.
    assert events == [
        f"not excluding node n3: {left} usable node(s) would be left in partition debug for a "
        "2-node job",
        in_place("n3: task 1: Killed, exit 137"),
    ]
    assert calls == IN_PLACE_CALLS


def test_a_node_that_misses_pings_still_counts(tmp_path: Path) -> None:
    """`idle*`: SLURM has not heard from n2's slurmd lately (a loaded machine); it is
    no reason to start the job on a node a task was killed on."""
    events, calls = _run_start(
        tmp_path, ["srun: error: n3: task 1: Killed"], rc=137,
        partition=["n1 mix*", "n2 idle*", "n3 mix"], task_logs={1: "step 15/60\n"},
    )  # fmt: skip
    assert events == [by_requeue("n3: task 1: Killed, exit 137", without="n3")]
    assert f"scontrol update JobId={JOB_ID} ExcNodeList=n3" in calls


@pytest.mark.parametrize(
    ("no_respond", "event"),
    [("n1", "n3: task 1: Killed, exit 137"),  # the script's own node
     ("n1 n3", "node n3 is down, drained or not responding, exit 137")],
)  # fmt: skip
def test_the_scripts_own_node_is_never_blamed_for_missed_pings(
    tmp_path: Path, no_respond: str, event: str
) -> None:
    events, _ = _run_start(
        tmp_path, ["srun: error: n3: task 1: Killed"], rc=137, partition=THREE_NODES,
        task_logs={1: "step 15/60\n"}, no_respond=no_respond,
    )  # fmt: skip
    assert events == [by_requeue(event, without="n3")]


def test_a_killed_task_is_replaced_by_a_spare_in_place(tmp_path: Path) -> None:
    """job.spare_nodes=1: the job holds n1-n3 and trains on n1 and n2; n2's task is
    killed, so the next attempt runs on n1 and the spare n3, in the same allocation."""
    events, calls = _run_start(
        tmp_path,
        ["srun: error: n2: task 1: Killed", "srun: error: n1: task 0: Exited with exit code 76"],
        rc=137, partition=THREE_NODES, nodelist="n1,n2,n3", task_logs={1: "step 15/60\n"},
    )  # fmt: skip
    assert events == [in_place("n2: task 1: Killed, exit 137", nodes="n1,n3", without="n2")]
    assert calls == ["srun --nodelist=n1,n2", f"scancel {JOB_ID}.0", "srun --nodelist=n1,n3"]
    attempts = (tmp_path / "run" / "attempts").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in attempts] == [
        f"restart=0 job={JOB_ID} nodes=n1,n2 how=start spares=n3",
        f"restart=1 job={JOB_ID} nodes=n1,n3 how=in-place",
    ]
    failures = (tmp_path / "run" / "failures").read_text()
    assert " restart=0 exit=137 node=n2 how=in-place kind=n2: task 1: Killed" in failures


def test_a_frozen_node_is_given_up_at_once_when_a_spare_replaces_it(tmp_path: Path) -> None:
    """n2 froze: rank 0 found rank 1 silent and exited 76, and srun would wait for n2's
    task until SLURM marks the node down. With a spare the step is given up at once and
    the job goes on without n2; n1, whose task srun named ended, is kept."""
    started = time.time()
    events, calls = _run_start(
        tmp_path, ["srun: error: n1: task 0: Exited with exit code 76"], rc=0,
        partition=THREE_NODES, nodelist="n1,n2,n3", hangs=True,
        heartbeats={1: CANCEL_TIME}, hosts={1: "n2"}, announced={0: 76}, silent={0: [1]},
    )  # fmt: skip
    # Inside STEP_END_WAIT (KillWait 5 s + 5): the silent node's tasks are not waited for.
    assert time.time() - started < 10
    assert events[0].startswith("attempt 0: node(s) n2 did not end their tasks "), events
    assert events[1:] == [in_place("node n2 did not end its tasks, exit 137", nodes="n1,n3",
                                   without="n2")]  # fmt: skip
    assert calls == ["srun --nodelist=n1,n2", f"scancel {JOB_ID}.0", "srun --nodelist=n1,n3"]


def test_without_a_spare_a_step_that_does_not_end_is_given_up_after_kill_wait(
    tmp_path: Path,
) -> None:
    """No spare: the silent rank may be a stopped process SLURM kills after KillWait, so
    the script waits that long and a margin (KillWait 0 s here, and 5 s) before it takes
    the node for frozen; then it cannot leave the node out in place, and requeues."""
    events, calls = _run_start(
        tmp_path, ["srun: error: n1: task 0: Exited with exit code 76"], rc=0,
        partition=THREE_NODES, hangs=True, heartbeats={1: CANCEL_TIME}, hosts={1: "n3"},
        announced={0: 76}, silent={0: [1]}, kill_wait=0,
    )  # fmt: skip
    waited = int(re.search(r"did not end their tasks (\d+) s after", events[0])[1])  # type: ignore[index]
    assert 5 <= waited <= 20, events
    assert events[1:] == [by_requeue("node n3 did not end its tasks, exit 137", without="n3")]
    assert calls == [FIRST, f"scontrol requeuehold {JOB_ID}",
                     f"scontrol update JobId={JOB_ID} ExcNodeList=n3",
                     f"scontrol release {JOB_ID}"]  # fmt: skip


def test_nothing_holds_the_scripts_output_once_it_has_ended(tmp_path: Path) -> None:
    """Whoever reads a batch script's output to its end (a pipe into tee, a test's
    capture) is done when the script ends: the step's watcher, killed as the step ends,
    leaves nothing holding that output, not even the sleep of its last second (which
    made every script end a second late for such a reader)."""
    spec = make_spec(command=["true"], run_dir=tmp_path / "run", workdir=tmp_path)
    script, env = prepare_batch_script(render_sbatch(spec).text, tmp_path)
    with subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as ran:  # fmt: skip
        assert ran.stdout is not None
        pipe = f"pipe:[{os.fstat(ran.stdout.fileno()).st_ino}]"
        assert ran.wait(timeout=SCRIPT_TIMEOUT_S) == 0, ran.stdout.read()
        holders = []
        for fd in Path("/proc").glob("[0-9]*/fd/[0-9]*"):
            if fd.parts[2] == str(os.getpid()):  # the reading end, ours
                continue
            with contextlib.suppress(OSError):  # a process that ended while we looked
                if os.readlink(fd) == pipe:
                    holders.append((fd.parts[2], (fd.parents[1] / "cmdline").read_bytes()))
        assert holders == []
