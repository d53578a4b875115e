"""`stoker why`: the parsers on recorded text, the judgement on recorded facts, and
real jobs on the cluster: a failing rank of four, a job over --mem, a cancelled and a
pending job, a local job, and one job that hits its time limit with a hung rank.

Recorded texts come from this repository's test cluster (SLURM 22.05); the
OverMemoryKill ones from a second test cluster with memory enforcement on.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from stoker.launcher.jobs.ledger import Ledger
from stoker.launcher.jobs.targets import resolve_job
from stoker.launcher.slurm import cli as slurm_cli
from stoker.launcher.slurm.query import (
    ScontrolJob,
    parse_mem,
    parse_sacct_steps,
    parse_scontrol_job,
)
from stoker.launcher.why import (
    SIGNATURES,
    JobFacts,
    diagnose,
    exception_line,
    explain_pending,
    find_signature,
    first_failure,
    gather_facts,
    judge,
    last_traceback,
    parse_task_failures,
)
from tests.clirun import stoker_text
from tests.launcher_jobs import scontrol_job, submit_json, wait_final, wait_for

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

PYTHON = sys.executable

# ---------------------------------------------------------------- recorded text

FAILED_BATCH = """\
srun: error: n2: task 2: Exited with exit code 1
srun: launch/slurm: _step_signal: Terminating StepId=508.0
srun: error: n2: task 3: Terminated
srun: error: n1: tasks 0-1: Terminated
srun: Force Terminated StepId=508.0
"""
FAILED_RANK_2 = """\
rank 2 starting
about to fail
Traceback (most recent call last):
  File "/tmp/lw/fail.py", line 9, in <module>
    inner()
  File "/tmp/lw/fail.py", line 5, in inner
    raise ValueError(f"bad batch shape on rank {rank}")
ValueError: bad batch shape on rank 2
"""
TIMEOUT_BATCH = """\
stoker: stop requested: SIGUSR2
slurmstepd-n1: error: *** JOB 511 ON n1 CANCELLED AT 2026-11-21T06:13:35 DUE TO TIME LIMIT ***
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
srun: got SIGCONT
srun: forcing job termination
stoker: stop requested: SIGTERM
srun: error: n1: tasks 0-1: Terminated
srun: launch/slurm: _step_signal: Terminating StepId=511.0
"""
TIMEOUT_SACCT = """\
511|TIMEOUT|0:0|0:0||12052M|00:01:00|00:01:19|n1|2026-11-21T06:13:35||1
511.batch|FAILED|15:0|||||00:01:19|n1|2026-11-21T06:13:35|1|1
511.0|CANCELLED|0:15|||||00:01:19|n1|2026-11-21T06:13:35|2|1
"""
# JobAcctGatherType=jobacct_gather/linux, JobAcctGatherParams=OverMemoryKill.
OVERMEM_BATCH = """\
slurmstepd-n1: error: Exceeded job memory limit
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
srun: error: n1: tasks 0-1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=6.0
"""
OVERMEM_RANK_0 = """\
slurmstepd-n1: error: StepId=6.0 exceeded memory limit (434839552 > 209715200), being killed
slurmstepd-n1: error: *** STEP 6.0 ON n1 CANCELLED AT 2026-11-21T06:17:25 ***
"""
OVERMEM_SACCT = """\
6|FAILED|9:0|0:9||200M|00:01:00|00:00:01|n1|2026-11-21T06:17:25||1
6.batch|FAILED|9:0||12372K|||00:00:01|n1|2026-11-21T06:17:25|1|1
6.0|CANCELLED by 0|0:9||423016K|||00:00:01|n1|2026-11-21T06:17:25|2|1
"""
SCONTROL_PENDING = (
    "JobId=601 JobName=stoker-tiny UserId=root(0) GroupId=root(0) Priority=4294901 "
    "JobState=PENDING Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 "
    "ExitCode=0:0 RunTime=00:00:00 TimeLimit=00:05:00 NodeList= "
    "Command=/home/a b/job.sbatch WorkDir=/tmp MinMemoryNode=64G"
)


def test_srun_lines_give_the_first_failure() -> None:
    failures = parse_task_failures(FAILED_BATCH)
    assert [(f.node, f.ranks, f.exit_code, f.signal) for f in failures] == [
        ("n2", (2,), 1, None),
        ("n2", (3,), None, 15),
        ("n1", (0, 1), None, 15),
    ]
    first = first_failure(failures)
    assert first is not None and first.ranks == (2,) and first.status == 1
    killed = parse_task_failures(OVERMEM_BATCH)
    assert [(f.ranks, f.signal, f.status) for f in killed] == [((0, 1), 9, 137)]
    # Terminated lines come after the real failure; a segfault with a core is still one.
    crash = parse_task_failures(
        "srun: error: n1: task 0: Terminated\n"
        "srun: error: gpu-07: task 13: Segmentation fault (core dumped)\n"
    )
    first = first_failure(crash)
    assert first is not None and first.ranks == (13,) and first.signal == 11
    local = parse_task_failures(
        "local: error: task 1: Exited with exit code 3\n"
        "local: error: task 0: Exited with exit code -9\n"
    )
    assert [(f.node, f.ranks, f.exit_code, f.signal) for f in local] == [
        (None, (1,), 3, None),
        (None, (0,), None, 9),
    ]
    assert parse_task_failures("srun: Job step aborted: Waiting up to 7 seconds\n") == []


def test_traceback_and_exception_line() -> None:
    tb = last_traceback(FAILED_RANK_2)
    assert tb is not None and tb[0] == "Traceback (most recent call last):"
    assert exception_line(tb) == "ValueError: bad batch shape on rank 2"
    # A chained exception: the last traceback is the one that ended the process; the
    # prefix torch.distributed puts on each line is dropped.
    chained = (
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "a.py", line 1, in <module>\n'
        "[rank3]: KeyError: 'x'\n"
        "[rank3]: \n"
        "[rank3]: During handling of the above exception, another exception occurred:\n"
        "[rank3]: \n"
        "[rank3]: Traceback (most recent call last):\n"
        '[rank3]:   File "a.py", line 3, in <module>\n'
        "[rank3]:     load()\n"
        "[rank3]: RuntimeError: checkpoint shard 7 is missing\n"
        "some later output\n"
    )
    tb = last_traceback(chained)
    assert tb is not None and exception_line(tb) == "RuntimeError: checkpoint shard 7 is missing"
    assert "some later output" not in tb
    deep = "Traceback (most recent call last):\n" + '  File "f.py", line 1, in f\n' * 100
    deep += "RecursionError: maximum recursion depth exceeded\n"
    tb = last_traceback(deep)
    assert tb is not None and len(tb) == 30 and "lines)" in tb[1]
    assert exception_line(tb) == "RecursionError: maximum recursion depth exceeded"
    assert last_traceback("step 1\nstep 2\n") is None


@pytest.mark.parametrize(
    ("line", "cause"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 "
            "has a total capacity of 79.11 GiB of which 3.56 MiB is free.",
            "gpu-oom",
        ),
        (
            "[rank1]:[E1121 06:00:00 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught "
            "collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
            "NumelOut=1, Timeout(ms)=600000) ran for 600023 milliseconds before timing out.",
            "nccl-timeout",
        ),
        (
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, "
            "unhandled system error (run with NCCL_DEBUG=INFO for details)",
            "nccl",
        ),
        (
            "torch.distributed.DistNetworkError: The client socket has failed to connect to "
            "[n1]:20512 (errno: 111 - Connection refused).",
            "rendezvous",
        ),
        (
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use",
            "port-in-use",
        ),
        (
            "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError",
            "rendezvous",
        ),
        (
            "slurmstepd-n1: error: StepId=6.0 exceeded memory limit (434839552 > 209715200), "
            "being killed",
            "host-oom",
        ),
        ("slurmstepd: error: Detected 1 oom-kill event(s) in StepId=12.0.", "host-oom"),
        ("MemoryError", "host-oom"),
    ],
)
def test_signatures(line: str, cause: str) -> None:
    hit = find_signature(f"step 10 loss 2.3\n{line}\nafter\n", "rank 1")
    assert hit is not None and hit.signature.cause == cause and hit.line == line.strip()
    assert find_signature("step 10 loss 2.3\nall good\n", "rank 1") is None


def test_signature_table_order_decides() -> None:
    # A refused connection because the port is taken: the specific cause wins.
    text = "DistNetworkError: connect failed: Connection refused\nEADDRINUSE on port 20512\n"
    hit = find_signature(text, "rank 0")
    assert hit is not None and hit.signature.cause == "port-in-use"
    assert [s.cause for s in SIGNATURES].index("port-in-use") < [s.cause for s in SIGNATURES].index(
        "rendezvous"
    )


def test_sacct_and_scontrol_parsers() -> None:
    rows = parse_sacct_steps(OVERMEM_SACCT)
    assert [r.step_id for r in rows] == ["6", "6.batch", "6.0"]
    job, _, step = rows
    assert job.is_job and job.state == "FAILED" and job.req_mem == 200 * 2**20
    assert job.time_limit_s == 60 and job.elapsed_s == 1 and job.node_list == "n1"
    assert step.state == "CANCELLED" and step.cancelled_by == 0 and step.signal == 9
    assert step.max_rss == 423016 * 1024 and step.ntasks == 2 and step.nnodes == 1
    timeout = parse_sacct_steps(TIMEOUT_SACCT)[0]
    assert timeout.state == "TIMEOUT" and timeout.elapsed_s == 79 and timeout.max_rss is None
    assert parse_mem("1.5G") == int(1.5 * 2**30) and parse_mem("4000Mn") == 4000 * 2**20
    assert parse_mem("") is None
    fields = parse_scontrol_job(SCONTROL_PENDING)
    assert fields["JobState"] == "PENDING" and fields["Reason"] == "BeginTime"
    assert fields["Restarts"] == "1" and fields["Command"] == "/home/a b/job.sbatch"
    assert fields["NodeList"] == ""
    live = ScontrolJob.from_fields(fields)
    assert live.state == "PENDING" and live.reason == "BeginTime" and live.restarts == 1
    assert live.exit_code == 0 and live.signal is None and live.node_list is None
    assert live.time_limit_s == 300 and live.elapsed_s == 0 and live.end is None
    assert live.min_mem == 64 * 2**30 and live.min_mem_text == "64G"
    bare = ScontrolJob.from_fields({"JobId": "601"})
    assert bare.state is None and bare.reason is None and bare.min_mem is None


def recorded_timeout(*, hung: bool) -> JobFacts:
    """The facts of the recorded time-limit job (511): rank 0 printed until the end;
    rank 1 stopped 78 s before it when `hung`."""
    end = 1_795_241_615.0
    return JobFacts(
        job_id="511",
        state="TIMEOUT",
        exit_code=0,
        elapsed_s=79,
        time_limit_s=60,
        end_time=end,
        node_list="n1",
        batch_log=TIMEOUT_BATCH,
        rank_logs={
            0: "step 38\nstep 39\nslurmstepd-n1: error: *** STEP 511.0 ON n1 CANCELLED AT "
            "2026-11-21T06:13:35 DUE TO TIME LIMIT ***\n",
            1: "rank 1 starting\nrank 1 waiting for a collective\n",
        },
        rank_mtimes={0: end, 1: end - 78 if hung else end - 1},
        events=[f"{int(end) - 31} stop requested: SIGUSR2", f"{int(end)} stop requested: SIGTERM"],
    )


def test_time_limit_with_and_without_a_hung_rank() -> None:
    hung = judge(recorded_timeout(hung=True))
    assert hung.cause == "hung" and hung.failing_rank == 1
    assert hung.summary == "hung: no output from rank(s) 1 for 78 s before the time limit (1:00)"
    assert "rank 1 last printed: rank 1 waiting for a collective" in hung.evidence
    assert "more time will not help" in (hung.fix or "")

    slow = judge(recorded_timeout(hung=False))
    assert slow.cause == "time-limit" and slow.failing_rank is None and slow.exit_code is None
    assert slow.summary == "reached its time limit (1:00) after 1:19"
    assert any("DUE TO TIME LIMIT" in line for line in slow.evidence)
    assert any("asked to stop" in line for line in slow.evidence)
    assert "job.time" in (slow.fix or "") and "STOKER_STOP_FILE" in (slow.fix or "")


def test_memory_kill_by_slurm_names_used_and_allowed() -> None:
    rows = parse_sacct_steps(OVERMEM_SACCT)
    facts = JobFacts(
        job_id="6",
        state="FAILED",
        exit_code=9,
        req_mem=200 * 2**20,
        req_mem_text="200M",
        steps=[r for r in rows if not r.is_job],
        batch_log=OVERMEM_BATCH,
        rank_logs={0: OVERMEM_RANK_0, 1: "loading the dataset into memory\nloaded\n"},
    )
    diagnosis = judge(facts)
    assert diagnosis.cause == "host-oom" and diagnosis.exit_code == 137
    assert diagnosis.summary == (
        "host out of memory: the tasks used 414.7 MiB, over the 200.0 MiB allowed "
        "(--mem 200M per node); SLURM killed ranks 0-1"
    )
    assert diagnosis.evidence[0].startswith("rank 0: slurmstepd-n1: error: StepId=6.0 exceeded")
    assert any(
        "peak RSS of one task 413.1 MiB" in e and "at or over" in e for e in diagnosis.evidence
    )
    assert "job.mem" in (diagnosis.fix or "") and "num_workers" in (diagnosis.fix or "")


def test_failed_rank_signature_beats_its_traceback() -> None:
    gpu = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 80, in step\n'
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has "
        "a total capacity of 79.11 GiB of which 1.02 GiB is free.\n"
    )
    facts = JobFacts(
        job_id="700",
        state="FAILED",
        exit_code=1,
        batch_log="srun: error: gpu-01: task 3: Exited with exit code 1\n"
        "srun: error: gpu-01: tasks 0-2: Terminated\n",
        rank_logs={0: "[rank0]: NCCL error ... remote process exited\n", 3: gpu},
    )
    diagnosis = judge(facts)
    assert diagnosis.cause == "gpu-oom" and diagnosis.failing_rank == 3
    assert diagnosis.exit_code == 1
    assert "activation_checkpointing" in (diagnosis.fix or "")
    assert any("CUDA out of memory" in e for e in diagnosis.evidence)


def test_the_error_the_failing_rank_reported_is_the_headline_with_its_fix() -> None:
    # As `stoker run data.url=/tmp/missing` leaves it: rank 1 reports the missing data
    # set in stoker's words and exits 1; rank 0, stopped because of it, exits -15.
    rank1 = (
        "stoker: rank 1: no data set at '/tmp/missing': manifest.json is missing there\n"
        "  fix: write one with `stoker data synth DST`\n"
    )
    facts = JobFacts(
        job_id="local-4",
        backend="local",
        state="FAILED",
        exit_code=1,
        batch_log="local: error: task 1: Exited with exit code 1\n",
        local_ranks={0: -15, 1: 1},
        rank_logs={0: "train.precision=auto: fp32\n", 1: "[rank1]: loading\n" + rank1},
    )
    diagnosis = judge(facts)
    assert diagnosis.cause == "error" and diagnosis.failing_rank == 1
    missing = "no data set at '/tmp/missing': manifest.json is missing there"
    assert diagnosis.summary == f"rank 1: {missing}"
    assert diagnosis.fix == "write one with `stoker data synth DST`"
    assert any("logs/r0/rank-1.log: stoker: rank 1: no data set" in e for e in diagnosis.evidence)
    # The runtime's notes on how a rank ended are no user error: the exit code rule says it.
    lost = "stoker: rank 1: a collective lost a peer (killed, frozen, or its node lost); exit 76\n"
    facts.rank_logs = {1: lost}
    assert judge(facts).cause == "exit-code"


def test_requeues_exhausted_and_pending_after_requeue() -> None:
    exhausted = judge(
        JobFacts(
            job_id="800",
            state="FAILED",
            exit_code=75,
            batch_log="stoker: stop requested: SIGUSR2\n",
            events=[
                "100 stop requested: SIGUSR2",
                "160 not requeued after time limit: 3 of job.max_requeues=3 restarts used",
            ],
        )
    )
    assert exhausted.cause == "requeues-exhausted" and exhausted.exit_code == 75
    assert "3 of job.max_requeues=3 restarts used" in exhausted.summary
    assert "job.max_requeues" in (exhausted.fix or "")

    fields = parse_scontrol_job(SCONTROL_PENDING)
    pending = judge(
        JobFacts(
            job_id="601",
            state=fields["JobState"],
            reason=fields["Reason"],
            restarts=int(fields["Restarts"]),
        )
    )
    assert pending.cause == "pending" and pending.exit_code is None
    assert pending.summary.startswith("pending (BeginTime): ")
    assert "requeued 1 time(s) so far" in pending.evidence
    assert pending.fix == "`scontrol update JobId=601 StartTime=now` lets it start at once"
    meaning, fix = explain_pending("QOSMaxJobsPerUserLimit")
    assert "QOS" in meaning and "--qos" in fix
    assert "man squeue" in explain_pending("SomethingNew")[1]


def test_running_job_with_a_silent_rank() -> None:
    import time

    now = time.time()
    facts = JobFacts(
        job_id="5",
        state="RUNNING",
        elapsed_s=600,
        node_list="n[1-2]",
        rank_logs={0: "step 90\n", 1: "step 12\n"},
        rank_mtimes={0: now - 2, 1: now - 400},
    )
    running = judge(facts)
    assert running.cause == "running" and running.exit_code is None
    assert running.summary == "running for 10:00 on n[1-2]; rank(s) 1 may be hung"
    assert "last output from any rank 2 s ago" in running.evidence
    facts.rank_mtimes[1] = now - 5
    assert judge(facts).summary == "running for 10:00 on n[1-2]"


def test_node_failure_and_preemption() -> None:
    node = judge(JobFacts(job_id="9", state="NODE_FAIL", node_list="gpu-[01-02]"))
    assert node.cause == "node-failure" and "gpu-[01-02]" in node.summary
    preempted = judge(JobFacts(job_id="9", state="PREEMPTED"))
    assert preempted.cause == "preempted" and "stoker requeue 9" in (preempted.fix or "")
    # Once SLURM has forgotten the job only a new submission continues it, from the root
    # its checkpoints are in (a new run folder's own is empty).
    root = "/runs/exp-1/checkpoints"
    forgotten = judge(
        JobFacts(job_id="9", state="CANCELLED", slurm_forgot=True, checkpoint_root=root)
    )
    assert forgotten.fix == (
        "nothing failed; SLURM no longer knows the job, so it cannot be requeued: submit it "
        f"again with checkpoint.root={root} (a new run folder has no checkpoints of its own)"
    )
    # Out of time: more time means a new submission, which continues only from that root.
    timed_out = judge(JobFacts(job_id="9", state="TIMEOUT", checkpoint_root=root))
    assert f"submit it again with a longer --time (job.time) and checkpoint.root={root}" in (
        timed_out.fix or ""
    )
    done = judge(JobFacts(job_id="9", state="COMPLETED", exit_code=0))
    assert done.cause == "completed" and done.exit_code == 0


# ---------------------------------------------------------------- real jobs

FAILING = """\
import os, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} of {os.environ['WORLD_SIZE']} starting", flush=True)
def load_batch():
    raise ValueError(f"bad batch shape on rank {rank}")
if rank == 2:
    time.sleep(0.5)
    load_batch()
time.sleep(60)
"""

HANGING = """\
import os, signal, time
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # deaf to the stop request, as a hung rank is
rank = os.environ["RANK"]
print(f"rank {rank} started", flush=True)
if rank == "1":
    print("rank 1 waiting for the all-reduce", flush=True)
    while True:
        time.sleep(3600)
step = 0
while True:
    step += 1
    print(f"step {step}", flush=True)
    time.sleep(1)
"""

# Rank 1 allocates 400 MiB in a job with --mem=200M; SLURM kills the step. The test
# cluster enforces --mem as production clusters do (tests/cluster/localslurm.py:
# CR_Core_Memory, jobacct_gather/linux with OverMemoryKill).
OVER_MEMORY = """\
#!/bin/bash
if [ "$RANK" = 1 ]; then
    exec "$PYTHON" -c "
print('loading the dataset into memory', flush=True)
data = bytearray(400 * 2**20)
for i in range(0, len(data), 4096):
    data[i] = 1
print('loaded', flush=True)
import time; time.sleep(30)
"
fi
exec sleep 30
"""


def _slurm_enforces_memory() -> bool:
    config = subprocess.run(
        ["scontrol", "show", "config"], capture_output=True, text=True, check=True
    ).stdout
    return "OverMemoryKill" in config or "ConstrainRAMSpace = yes" in config


@dataclass
class Jobs:
    ids: dict[str, str]
    env: dict[str, str]
    home: Path

    def why(self, role: str) -> dict:
        result = stoker_text("why", self.ids[role], "--json", env=self.env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture(scope="module")
def jobs(
    slurm_cluster: ClusterSettings,
    tmp_path_factory: pytest.TempPathFactory,
    module_home: dict[str, str],
) -> Iterator[Jobs]:
    env = module_home
    work = tmp_path_factory.mktemp("why-work")
    for name, text in (
        ("failing.py", FAILING),
        ("hanging.py", HANGING),
        ("over_memory.sh", OVER_MEMORY),
    ):
        (work / name).write_text(text)
    (work / "over_memory.sh").chmod(0o755)
    short = ("--time", "1", "job.stop_grace=10")

    def submit(*args: str) -> str:
        return str(submit_json(*args, cwd=work, env=env, in_process=True)["job_id"])

    ids: dict[str, str] = {}
    if not _slurm_enforces_memory():
        pytest.fail(
            "this cluster does not enforce --mem (no OverMemoryKill, no ConstrainRAMSpace): "
            "a job over --mem cannot be diagnosed here",
            pytrace=False,
        )
    try:
        # The time-limit job first: its minute is the module's longest wait, and the
        # other tests run meanwhile. It holds one node (2 CPUs); the four ranks of the
        # failing job fill the other two.
        ids["hung"] = submit(
            "--ntasks-per-node",
            "2",
            *short,
            "job.max_requeues=0",
            "--",
            PYTHON,
            str(work / "hanging.py"),
        )
        ids["failing"] = submit(
            "--nodes", "2", "--ntasks-per-node", "2", *short, "--", PYTHON, str(work / "failing.py")
        )
        # Bounded as if it had to wait for the time-limit job's node (a node left out).
        wait_final(ids["failing"], 180)
        # No restart: the batch script takes srun's "Killed" for a node fault and would
        # start it again on another node, which then needs a whole node free (2 CPUs).
        ids["memory"] = submit(
            "--ntasks-per-node",
            "2",
            "--mem",
            "200M",
            *short,
            "job.max_restarts=0",
            f"job.env.PYTHON={PYTHON}",
            "--",
            str(work / "over_memory.sh"),
        )
        ids["cancelled"] = submit(*short, "--", "bash", "-c", "echo started; sleep 50")
        ids["pending"] = submit("--after", ids["hung"], *short, "--", "true")
        yield Jobs(ids, env, Path(env["HOME"]))
    finally:
        for job_id in ids.values():
            if scontrol_job(job_id).get("JobState") in {"RUNNING", "PENDING"}:
                subprocess.run(["scancel", job_id], check=False)


@pytest.mark.slurm
def test_failing_rank_and_its_traceback(jobs: Jobs) -> None:
    job_id = jobs.ids["failing"]
    diagnosis = jobs.why("failing")
    assert diagnosis["state"] == "FAILED" and diagnosis["cause"] == "exception"
    assert diagnosis["failing_rank"] == 2 and diagnosis["exit_code"] == 1
    assert diagnosis["summary"] == "rank 2 failed first: ValueError: bad batch shape on rank 2"
    evidence = diagnosis["evidence"]
    assert (
        evidence[0].startswith("batch.log: srun: error: ")
        and "task 2: Exited with exit code 1" in evidence[0]
    )
    assert "  Traceback (most recent call last):" in evidence
    assert evidence[-1] == "  ValueError: bad batch shape on rank 2"
    assert any("in load_batch" in line for line in evidence)

    text = stoker_text("why", job_id, env=jobs.env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert (
        lines[0]
        == f"job {job_id} FAILED: rank 2 failed first: ValueError: bad batch shape on rank 2"
    )
    assert lines[1] == "evidence:" and lines[-1].startswith("fix: fix the error in rank 2's")

    # One scontrol and one sacct call, whatever the job.
    slurm_cli.CALLS.clear()
    ledger = Ledger(jobs.home / ".stoker" / "ledger.sqlite")
    assert diagnose(resolve_job(job_id, ledger)).failing_rank == 2
    assert dict(slurm_cli.CALLS) == {"scontrol": 1, "sacct": 1}


@pytest.mark.slurm
def test_logs_follow_ends_a_failed_job_with_the_first_failing_ranks_error(jobs: Jobs) -> None:
    """`stoker logs -f` follows rank 0, which SLURM ended after rank 2 raised: at the end
    it says why, as `stoker why` does, and exits 0 (following worked)."""
    job_id = jobs.ids["failing"]
    result = stoker_text("logs", "-f", job_id, env=jobs.env)
    assert result.returncode == 0, result.stderr
    tail = result.stderr.strip().splitlines()
    headline = f"job {job_id} FAILED: rank 2 failed first: ValueError: bad batch shape on rank 2"
    assert headline in tail, result.stderr
    assert tail[tail.index(headline) + 1] == "evidence:"
    assert "    ValueError: bad batch shape on rank 2" in tail  # its traceback, indented
    assert tail[-1].startswith("fix: fix the error in rank 2's"), tail[-1]


@pytest.mark.slurm
def test_status_reason_is_whys_headline_and_the_run_ends_failed(jobs: Jobs) -> None:
    """Rank 2 raised; SLURM ended the others (exit 15): status names rank 2's error, and
    the MLflow run of this plain command (no stoker runtime to end it) ends FAILED, by
    the batch script's last line."""
    from mlflow.tracking import MlflowClient

    job_id = jobs.ids["failing"]
    record = Ledger(jobs.home / ".stoker" / "ledger.sqlite").require(job_id)
    batch_log = (Path(record.run_dir) / "logs" / "batch.log").read_text()
    assert f"stoker: MLflow run {record.mlflow_run_id} ended FAILED" in batch_log
    store = jobs.home / ".stoker" / "mlflow" / "mlflow.db"
    run = MlflowClient(f"sqlite:///{store}").get_run(str(record.mlflow_run_id))
    assert run.info.status == "FAILED"

    result = stoker_text("status", job_id, "--json", env=jobs.env)
    assert result.returncode == 0, result.stderr
    (row,) = json.loads(result.stdout)
    assert row["state"] == "FAILED"
    assert row["reason"] == "rank 2 failed first: ValueError: bad batch shape on rank 2"
    # Kept in the ledger: the next call reads it back instead of judging again.
    again = Ledger(jobs.home / ".stoker" / "ledger.sqlite").require(job_id)
    assert again.extra["reasons"][job_id] == row["reason"]


@pytest.mark.slurm
def test_cancelled_job_names_who(jobs: Jobs) -> None:
    job_id = jobs.ids["cancelled"]
    status = stoker_text("status", job_id, "--json", env=jobs.env).stdout
    run = Path(json.loads(status)[0]["run_dir"])
    wait_for(lambda: "started" in _text(run / "logs" / "r0" / "rank-0.log"), 90, "the job to start")
    stoker_text("cancel", job_id, env=jobs.env, check=True)
    assert wait_final(job_id, 60) == "CANCELLED"
    user = pwd.getpwuid(os.getuid()).pw_name
    expected = f"cancelled by {user} (uid {os.getuid()})"
    # sacct learns who cancelled a moment after slurmctld.
    wait_for(lambda: jobs.why("cancelled")["summary"] == expected, 30, "sacct to record it")
    diagnosis = jobs.why("cancelled")
    assert diagnosis["cause"] == "cancelled" and diagnosis["exit_code"] is None
    assert f"sacct: State CANCELLED by {os.getuid()}" in diagnosis["evidence"]


@pytest.mark.slurm
def test_job_over_its_memory(jobs: Jobs) -> None:
    assert wait_final(jobs.ids["memory"], 90) == "FAILED"
    diagnosis = jobs.why("memory")
    assert diagnosis["cause"] == "host-oom", diagnosis
    assert "--mem 200M per node" in diagnosis["summary"], diagnosis
    assert "over the 200.0 MiB allowed" in diagnosis["summary"]
    assert "job.mem" in diagnosis["fix"]
    assert any("exceeded memory limit" in e for e in diagnosis["evidence"]), diagnosis


@pytest.mark.slurm
def test_pending_job_gives_the_reason(jobs: Jobs) -> None:
    diagnosis = jobs.why("pending")
    assert diagnosis["state"] == "PENDING" and diagnosis["cause"] == "pending"
    assert diagnosis["summary"] == (
        "pending (Dependency): waiting for the job(s) it depends on (--after) to finish"
    )
    assert diagnosis["fix"].startswith("nothing to do;")


def test_local_job_failure(tmp_path: Path) -> None:
    script = tmp_path / "local_fail.py"
    script.write_text(
        "import os, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    raise RuntimeError('shard list is empty')\n"
        "time.sleep(20)\n"
    )
    job = submit_json("--local", "--ntasks-per-node", "2", "--", PYTHON, str(script), cwd=tmp_path)
    state = Path(job["run_dir"]) / "local-state.json"
    wait_for(lambda: '"FAILED"' in _text(state), 30, "the local job to fail")
    result = stoker_text("why", job["job_id"], "--json")
    assert result.returncode == 0, result.stderr
    diagnosis = json.loads(result.stdout)
    assert diagnosis["state"] == "FAILED" and diagnosis["cause"] == "exception"
    assert diagnosis["failing_rank"] == 1 and diagnosis["exit_code"] == 1
    assert diagnosis["summary"] == "rank 1 failed first: RuntimeError: shard list is empty"
    assert "batch.log: local: error: task 1: Exited with exit code 1" in diagnosis["evidence"]


def test_unknown_job_is_the_ledgers_error() -> None:
    unknown = stoker_text("why", "31337")
    assert unknown.returncode == 2 and "job 31337 is not in the ledger" in unknown.stderr


@pytest.mark.slurm
def test_time_limit_with_a_hung_rank(jobs: Jobs) -> None:
    """The one slow test (~80 s): rank 0 prints every second, rank 1 hangs silently."""
    job_id = jobs.ids["hung"]
    assert wait_final(job_id, 180) == "TIMEOUT"
    diagnosis = jobs.why("hung")
    assert diagnosis["state"] == "TIMEOUT" and diagnosis["cause"] == "hung", diagnosis
    assert diagnosis["failing_rank"] == 1
    assert diagnosis["summary"].startswith("hung: no output from rank(s) 1 for ")
    assert diagnosis["summary"].endswith(" s before the time limit (1:00)")
    evidence = diagnosis["evidence"]
    assert any("DUE TO TIME LIMIT" in e for e in evidence)
    assert "rank 1 last printed: rank 1 waiting for the all-reduce" in evidence
    assert "rank(s) 0 kept printing until the end" in evidence
    assert any("stop requested: SIGUSR2" in e for e in evidence)

    # The same job without its silent rank is a plain time limit: more time, or requeue.
    ledger = Ledger(jobs.home / ".stoker" / "ledger.sqlite")
    facts = gather_facts(resolve_job(job_id, ledger))
    facts.rank_mtimes.pop(1)
    plain = judge(facts)
    assert plain.cause == "time-limit" and plain.summary.startswith("reached its time limit (1:00)")
    assert "job.time" in (plain.fix or "")

    # The job waiting on it can never start now, and says so.
    wait_for(
        lambda: "(DependencyNeverSatisfied)" in jobs.why("pending")["summary"],
        30,
        "the dependent job's reason to change",
    )
    assert "stoker cancel" in jobs.why("pending")["fix"]


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.slurm
def test_a_requeue_slurm_refuses_names_the_tasks_own_checkpoints(
    slurm_cluster: ClusterSettings, tmp_path: Path
) -> None:
    """`stoker requeue 123_2` of a sweep task SLURM has forgotten: the fix is a new
    submission from that task's checkpoints (tasks/2/checkpoints), not the sweep folder's,
    written as it can be pasted (the path has a space); the whole array, task by task."""
    from stoker.launcher.jobs.ledger import JobRecord

    run_dir = tmp_path / "my sweep"
    (run_dir / "tasks" / "2").mkdir(parents=True)
    (run_dir / "tasks" / "2" / "config.yaml").write_text("train:\n  steps: 5\n")
    job_id = "999971"  # no job of the cluster's
    Ledger().add(
        JobRecord(job_id, "slurm", "local", "sweep", str(run_dir), "0", "default", array_size=3)
    )
    task = stoker_text("requeue", f"{job_id}_2")
    assert task.returncode == 2, task.stderr
    said = " ".join(task.stderr.split())
    root = run_dir / "tasks" / "2" / "checkpoints"
    assert f"submit it again with 'checkpoint.root={root}' to continue" in said, said
    whole = " ".join(stoker_text("requeue", job_id).stderr.split())
    assert f"submit each task again with its checkpoint.root (`stoker why {job_id}_<i>`" in whole
