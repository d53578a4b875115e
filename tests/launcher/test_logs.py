"""`stoker logs` on real jobs: merged ranks, restarts, filters, following across a
requeue until the job ends, Ctrl-C, pending jobs, array tasks and local jobs.

One two-node job runs for the whole module: restart 0 prints and waits; the test
requeues it (as `stoker requeue` does) while `stoker logs -f` follows it; restart 1
prints, waits for a flag file, and completes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.clirun import STOKER, stoker_text
from tests.launcher_jobs import (
    as_a_shell_starts_it,
    mlflow_status,
    scontrol_job,
    submit_json,
    wait_final,
    wait_for,
)

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

PYTHON = sys.executable
RANKS = 2  # 2 nodes x 1 task: a small share of the shared test cluster

TALKER = """\
import os, sys, time
from pathlib import Path
rank, restart = os.environ["RANK"], os.environ["STOKER_RESTART"]
for i in range(3):
    print(f"restart={restart} rank={rank} line={i}", flush=True)
if rank == "1":
    print(f"restart={restart} rank=1 on stderr", file=sys.stderr, flush=True)
while not Path(sys.argv[1]).exists():  # restart 0 never sees it: it is requeued
    time.sleep(0.2)
print(f"restart={restart} rank={rank} done", flush=True)
"""


class Follower:
    """`stoker logs -f ...` as a user runs it, its stdout collected line by line."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            as_a_shell_starts_it([STOKER, "logs", "-f", *args]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def has(self, text: str) -> bool:
        return any(text in line for line in list(self.lines))

    def wait(self, timeout: float) -> tuple[int, str]:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        assert self.proc.stderr is not None
        return code, self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Talker:
    job_id: str
    run_dir: Path
    env: dict[str, str]
    follow_output: list[str]
    follow_rc: int
    follow_stderr: str
    pending_stderr: str
    interrupted_rc: int  # a second follower, stopped with Ctrl-C while restart 0 ran
    interrupted_stderr: str
    run_status: str  # its MLflow run's, once it completed


def _logs(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return stoker_text("logs", *args, env=env)


@pytest.fixture(scope="module")
def talker(
    slurm_cluster: ClusterSettings,
    tmp_path_factory: pytest.TempPathFactory,
    module_home: dict[str, str],
) -> Iterator[Talker]:
    env = module_home
    work = tmp_path_factory.mktemp("logs-work")
    (work / "talker.py").write_text(TALKER)
    finish = work / "finish"
    job = submit_json(
        "--nodes", "2", "--ntasks-per-node", "1", "--time", "2", "job.stop_grace=10",
        "--", PYTHON, str(work / "talker.py"), str(finish),
        cwd=work, env=env, in_process=True,
    )  # fmt: skip
    job_id, run_dir = job["job_id"], Path(job["run_dir"])
    follower: Follower | None = None
    interrupted: Follower | None = None
    pending_id = None
    try:
        r0 = run_dir / "logs" / "r0"
        wait_for(
            lambda: all("line=2" in _text(r0 / f"rank-{r}.log") for r in range(RANKS)),
            90,
            "restart 0 to print",
        )
        # A job that waits for this one is pending (Dependency) and has no logs.
        pending = submit_json(
            "--after", job_id, "--time", "1", "job.stop_grace=10", "--", "true",
            cwd=work, env=env, in_process=True,
        )  # fmt: skip
        pending_id = pending["job_id"]
        pending_logs = _logs(pending_id, env=env)
        assert pending_logs.returncode == 0, pending_logs.stderr
        stoker_text("cancel", pending_id, env=env, check=True)

        follower = Follower(job_id, env=env)
        # Ctrl-C while following the running job: a second follower, stopped as a user does.
        interrupted = Follower(job_id, env=env)
        wait_for(lambda: follower.has("restart=0 rank=1 line=2"), 30, "the follower to catch up")
        wait_for(lambda: interrupted.has("restart=0 rank=0 line=2"), 30, "the second follower")
        interrupted.proc.send_signal(signal.SIGINT)
        interrupted_rc, interrupted_stderr = interrupted.wait(timeout=60)  # a loaded machine
        subprocess.run(["scontrol", "requeue", job_id], check=True)
        wait_for(lambda: scontrol_job(job_id).get("JobState") == "PENDING", 30, "requeue")
        # Lift SLURM's ~2 min hold, but not within the second of the requeue: a start
        # in that second is refused on the nodes ("Job credential revoked").
        time.sleep(1.5)
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], check=True)
        r1 = run_dir / "logs" / "r1"
        wait_for(
            lambda: all("line=2" in _text(r1 / f"rank-{r}.log") for r in range(RANKS)),
            90,
            "restart 1 to print",
        )
        wait_for(lambda: follower.has("restart=1 rank=1 line=2"), 30, "the follower to see r1")
        finish.touch()
        assert wait_final(job_id, 60) == "COMPLETED"
        run_status = mlflow_status(job["run_id"], Path(env["STOKER_HOME"]))
        # The follower notices the end by itself (state every 3 s, then 1 s of quiet).
        follow_rc, follow_stderr = follower.wait(timeout=30)
        yield Talker(
            job_id, run_dir, env, follower.lines, follow_rc, follow_stderr, pending_logs.stderr,
            interrupted_rc, interrupted_stderr, run_status,
        )  # fmt: skip
    finally:
        finish.touch()
        for each in (follower, interrupted):
            if each is not None:
                each.kill()
        if pending_id and scontrol_job(pending_id).get("JobState") == "PENDING":
            subprocess.run(["scancel", pending_id], check=False)
        if scontrol_job(job_id).get("JobState") in {"RUNNING", "PENDING"}:
            subprocess.run(["scancel", job_id], check=False)


def _text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _program_lines(output: list[str]) -> list[str]:
    """The lines the talker printed, and the restart separators, in output order."""
    return [
        line
        for line in output
        if ("restart=" in line and not line.startswith("[batch] "))
        or line.startswith("--- restart")
    ]


def expected(restart: int) -> list[str]:
    lines = []
    for rank in range(RANKS):
        lines += [f"[{rank}] restart={restart} rank={rank} line={i}" for i in range(3)]
        if rank == 1:
            lines.append(f"[1] restart={restart} rank=1 on stderr")
        if restart == 1:
            lines.append(f"[{rank}] restart={restart} rank={rank} done")
    return lines


@pytest.mark.slurm
def test_follow_crosses_the_requeue_and_ends_with_the_job(talker: Talker) -> None:
    assert talker.follow_rc == 0, talker.follow_stderr
    assert "Traceback" not in talker.follow_stderr
    lines = _program_lines(talker.follow_output)
    # Every line once; restart 0's lines before the separator, restart 1's after it.
    assert lines.count("--- restart 1 ---") == 1
    cut = lines.index("--- restart 1 ---")
    assert sorted(lines[:cut]) == sorted(expected(0))
    assert sorted(lines[cut + 1 :]) == sorted(expected(1))
    # Lines of one rank keep their order.
    for rank in range(RANKS):
        own = [line for line in lines if line.startswith(f"[{rank}] ")]
        assert own == [line for line in expected(0) + expected(1) if line.startswith(f"[{rank}] ")]
    # slurmstepd's and srun's messages about the requeue come through as [batch] lines.
    assert any(
        line.startswith("[batch] ") and "DUE TO JOB REQUEUE" in line
        for line in talker.follow_output
    ), talker.follow_output
    # One MLflow run across the requeue, ended as the job ended: not by the first start.
    assert talker.run_status == "FINISHED"


@pytest.mark.slurm
def test_finished_job_prints_restart_by_restart_rank_by_rank(talker: Talker) -> None:
    result = _logs(talker.job_id, env=talker.env)
    assert result.returncode == 0, result.stderr
    output = result.stdout.splitlines()
    assert _program_lines(output) == [*expected(0), "--- restart 1 ---", *expected(1)]
    # batch.log: the requeue's teardown belongs to restart 0, nothing of it after restart 1.
    cut = output.index("--- restart 1 ---")
    requeue = [
        i
        for i, line in enumerate(output)
        if line.startswith("[batch] ") and "DUE TO JOB REQUEUE" in line
    ]
    assert requeue and all(i < cut for i in requeue), output
    # Each start's marker line from the batch script sits in its own restart.
    starts = [i for i, line in enumerate(output) if line.startswith("[batch] stoker: start ")]
    assert len(starts) == 2 and starts[0] < cut < starts[1], output
    assert all(line.startswith(("[0] ", "[1] ", "[batch] ", "--- restart")) for line in output)


@pytest.mark.slurm
def test_rank_grep_tail_and_restart_filters(talker: Talker) -> None:
    env = talker.env
    only_one = _logs(talker.job_id, "--rank", "1", env=env).stdout.splitlines()
    assert [line for line in only_one if "restart=" in line] == [
        line for line in expected(0) + expected(1) if line.startswith("[1] ")
    ]
    assert not any(line.startswith(("[0]", "[batch]")) for line in only_one)

    grep = _logs(talker.job_id, "--grep", r"line=2$", env=env).stdout.splitlines()
    assert grep == [
        "[0] restart=0 rank=0 line=2",
        "[1] restart=0 rank=1 line=2",
        "--- restart 1 ---",
        "[0] restart=1 rank=0 line=2",
        "[1] restart=1 rank=1 line=2",
    ]
    # Both together, as the docs' `stoker logs 1234 --rank 3 --grep loss`: that rank's matches.
    both = _logs(talker.job_id, "--rank", "1", "--grep", r"line=2$", env=env).stdout.splitlines()
    assert both == [
        "[1] restart=0 rank=1 line=2",
        "--- restart 1 ---",
        "[1] restart=1 rank=1 line=2",
    ]

    tail = _logs(talker.job_id, "--tail", "1", "--restart", "1", "--no-batch", env=env)
    assert tail.stdout.splitlines() == [
        "--- restart 1 ---",
        "[0] restart=1 rank=0 done",
        "[1] restart=1 rank=1 done",
    ]
    last = _logs(talker.job_id, "--restart", "last", "--grep", "done", env=env)
    assert last.stdout.splitlines()[1:] == [
        "[0] restart=1 rank=0 done",
        "[1] restart=1 rank=1 done",
    ]

    first = _logs(talker.job_id, "--restart", "0", "--no-batch", env=env).stdout
    assert "restart=1" not in first and "[batch]" not in first and "--- restart" not in first


@pytest.mark.slurm
def test_bad_selections_are_clear_errors(talker: Talker) -> None:
    env = talker.env
    regex = _logs(talker.job_id, "--grep", "loss[", env=env)
    assert regex.returncode == 2
    assert "--grep 'loss['" in regex.stderr and "not a valid regular expression" in regex.stderr
    restart = _logs(talker.job_id, "--restart", "7", env=env)
    assert restart.returncode == 2 and "restart(s) 0, 1" in restart.stderr
    rank = _logs(talker.job_id, "--rank", "5", env=env)
    assert rank.returncode == 2 and "rank(s) 0-1" in rank.stderr
    unknown = _logs("424242", env=env)
    assert unknown.returncode == 2 and "job 424242 is not in the ledger" in unknown.stderr


@pytest.mark.slurm
def test_pending_job_says_so(talker: Talker) -> None:
    assert re.search(r"job \d+ is pending \(Dependency\): no logs yet", talker.pending_stderr), (
        talker.pending_stderr
    )


@pytest.mark.slurm
def test_ctrl_c_stops_following_cleanly(talker: Talker) -> None:
    """A `stoker logs -f` of the running job (restart 0), sent SIGINT once it had shown
    rank 0's lines: it stops at once, exit 0, no traceback."""
    code, stderr = talker.interrupted_rc, talker.interrupted_stderr
    assert code == 0 and "Traceback" not in stderr, stderr


@pytest.mark.slurm
def test_array_job_asks_for_a_task(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    job = submit_sweep(tmp_path)
    wait_final(f"{job}_0")
    whole = stoker_text("logs", job)
    assert whole.returncode == 2
    assert f"job {job} is a job array of 2 tasks: {job}_0, {job}_1" in whole.stderr
    assert f"stoker logs {job}_0" in whole.stderr
    task = stoker_text("logs", f"{job}_0", "--no-batch")
    assert task.returncode == 0, task.stderr
    assert task.stdout.splitlines() == [f"[0] task {job}_0"]
    beyond = stoker_text("logs", f"{job}_5")
    assert beyond.returncode == 2 and "is not one of them" in beyond.stderr


def submit_sweep(cwd: Path) -> str:
    result = stoker_text(
        "sweep", "--json", "train.seed=1,2", "--time", "1", "job.stop_grace=10",
        "--", "bash", "-c", 'echo "task $STOKER_JOB_ID"',
        cwd=cwd,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    import json

    return str(json.loads(result.stdout.strip().splitlines()[-1])["job_id"])


def test_local_job_is_followed_to_its_end(tmp_path: Path) -> None:
    job = submit_json(
        "--local", "--ntasks-per-node", "2", "--",
        PYTHON, "-c", "import os, time; [print('local', os.environ['RANK'], i, flush=True) "
        "or time.sleep(0.3) for i in range(5)]",
        cwd=tmp_path,
    )  # fmt: skip
    started = time.monotonic()
    result = stoker_text("logs", "-f", job["job_id"])
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 30
    lines = result.stdout.splitlines()
    for rank in (0, 1):
        assert [line for line in lines if line.startswith(f"[{rank}] ")] == [
            f"[{rank}] local {rank} {i}" for i in range(5)
        ]


# ---------------------------------------------------------------- parsers on recorded text

# batch.log of a job requeued from outside (`scontrol requeue`) during restart 0, then
# cancelled during restart 1 (SLURM 22.05, this repository's test cluster).
REQUEUED_BATCH = """\
slurmstepd-n1: error: *** JOB 519 ON n1 CANCELLED AT 2026-11-21T06:13:54 DUE TO JOB REQUEUE ***
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
srun: got SIGCONT
srun: forcing job termination
stoker: stop requested: SIGTERM
srun: error: n1: tasks 0-1: Terminated
srun: launch/slurm: _step_signal: Terminating StepId=519.0
srun: Job step aborted: Waiting up to 7 seconds for job step to finish.
srun: got SIGCONT
slurmstepd-n2: error: *** JOB 519 ON n2 CANCELLED AT 2026-11-21T06:14:03 ***
srun: forcing job termination
stoker: stop requested: SIGTERM
srun: error: n2: tasks 0-1: Terminated
srun: launch/slurm: _step_signal: Terminating StepId=519.0
""".splitlines()


def test_batch_log_is_split_by_restart() -> None:
    from stoker.launcher.jobs.log_text import split_batch_by_restart

    parts = split_batch_by_restart(REQUEUED_BATCH, [0, 1])
    assert parts[0] == REQUEUED_BATCH[:7] and parts[1] == REQUEUED_BATCH[7:]
    # The batch script's own requeue (time limit, preemption) names the next restart.
    by_script = [
        "stoker: stop requested: SIGUSR2",
        "stoker: requeued after time limit: restart 1 of 3",
        "srun: error: n1: task 0: Exited with exit code 3",
    ]
    assert split_batch_by_restart(by_script, [0, 1]) == {0: by_script[:2], 1: by_script[2:]}
    # A start marker, where the batch script prints one, is exact.
    marked = ["stoker: start restart=0", "a", "stoker: start restart=1", "b"]
    assert split_batch_by_restart(marked, [0, 1]) == {0: marked[:2], 1: marked[2:]}
    # More boundaries than restart folders: the rest stays with the last one.
    assert split_batch_by_restart(by_script, [0]) == {0: by_script}


def test_log_file_reads_whole_lines_and_progress_bars(tmp_path: Path) -> None:
    from stoker.launcher.watch.logs import LogFile

    path = tmp_path / "rank-0.log"
    path.write_bytes(b"start\n 10%|#   |\r 50%|##  |\r100%|####|\nhalf a li")
    log = LogFile(path)
    assert list(log.lines()) == ["start", "100%|####|"]
    with path.open("ab") as handle:
        handle.write(b"ne\nlast, unfinished")
    assert list(log.lines()) == ["half a line"]
    assert list(log.lines(final=True)) == ["last, unfinished"]
    path.write_bytes(b"rewritten\n")  # shorter than what was read: start over
    assert list(log.lines()) == ["rewritten"]
