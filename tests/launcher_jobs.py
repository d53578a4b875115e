"""Helpers for launcher tests: submit through the real CLI and wait on the real scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.local.state import LocalState, read_local_state
from stoker.launcher.slurm.query import TERMINAL_STATES
from tests.clirun import stoker, stoker_text

JOBS = Path(__file__).parent / "jobs"
FINAL_STATES = TERMINAL_STATES  # the states after which a job has ended for good


def submit_json(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    in_process: bool = False,
) -> dict:
    """`stoker submit ... --json`: the parsed last line (the call must succeed).
    `in_process`: run the console entry point in this process (tests/clirun.py's
    `stoker_text`), for a test whose point is the job, not the submitting process: a
    `stoker submit` process pays 3-4 CPU-s for its imports (mlflow), this process has
    them already. Not for `--local`: its supervisor would be this process's child."""
    if in_process:
        assert "--local" not in args, "a --local submit runs as a process of its own"
        # It redirects this process's stdout and enters `cwd`: other threads would see both.
        assert threading.current_thread() is threading.main_thread(), "in_process: main thread"
        result = stoker_text("submit", "--json", *args, cwd=cwd, env=env)
        assert result.returncode == 0, f"submit failed:\n{result.stderr}\n{result.stdout}"
        return json.loads(result.stdout.strip().splitlines()[-1])
    # A submit imports mlflow and creates the run: 10-20 s on an idle 2-core VM, and
    # over 120 s seen under the CPU burner plus a loaded suite beside it.
    result = stoker("submit", "--json", *args, cwd=cwd, env=env, timeout=360)
    assert result.returncode == 0, f"submit failed:\n{result.stderr}\n{result.stdout}"
    return json.loads(result.stdout.strip().splitlines()[-1])


# Python's startup installs its KeyboardInterrupt handler only where SIGINT is at its
# default; a process inherits an ignored SIGINT (a script's background job has one, as
# pytest may), and then no Ctrl-C reaches it: a flake seen under load, never alone.
_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def as_a_shell_starts_it(argv: list[str]) -> list[str]:
    """`argv` started with SIGINT at its default, as a shell starts a foreground job
    (a Python without its site imports execs it: the same pid, ~20 ms)."""
    return [sys.executable, "-S", "-c", _DEFAULT_SIGINT, *argv]


def scontrol_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    ).stdout
    return dict(item.split("=", 1) for item in out.split() if "=" in item)


def wait_final(job_id: str, timeout: float = 120, run_dir: Path | None = None) -> str:
    """Poll slurmctld until the job has ended for good; a requeued job is not final.
    On a timeout, says why SLURM holds it (and the run folder's events and starts)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = scontrol_job(job_id).get("JobState", "")
        if state in FINAL_STATES:
            return state
        time.sleep(0.3)
    job = scontrol_job(job_id)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %E"], capture_output=True,
                           text=True, check=False).stdout  # fmt: skip
    pytest.fail(
        f"job {job_id} still {state or 'unknown'} after {timeout} s: "
        f"Reason={job.get('Reason')} ExcNodeList={job.get('ExcNodeList')} "
        f"NodeList={job.get('NodeList')} Restarts={job.get('Restarts')}\nnodes:\n{nodes}"
        + (run_story(run_dir) if run_dir else "")
    )


def run_story(run_dir: Path) -> str:
    """What the batch script recorded of a job's starts (attempts, events, failures, the
    end of batch.log) and the end of each rank's log per start: a failed assertion's
    message, so that a failure in CI can be read without its run folder."""
    story = ""
    for name in ("attempts", "events", "failures"):
        if (run_dir / name).exists():
            story += f"\n{name}:\n{(run_dir / name).read_text()}"
    batch = run_dir / "logs" / "batch.log"
    if batch.exists():
        story += "\nbatch.log (end):\n" + "\n".join(batch.read_text().splitlines()[-60:])
    for log in sorted((run_dir / "logs").glob("r*/rank-*.log")):
        story += f"\n{log.parent.name}/{log.name} (end):\n" + log.read_text()[-1200:]
    return story


def rank_lines(run_dir: Path, restart: int = 0) -> dict[int, str]:
    """Each task's log of a start: rank -> text."""
    logs = run_dir / "logs" / f"r{restart}"
    return {int(p.stem.split("-")[1]): p.read_text() for p in logs.glob("rank-*.log")}


def wait_for(predicate, timeout: float = 60, what: str = "condition") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    pytest.fail(f"timed out after {timeout} s waiting for {what}")


def local_job(ledger: Ledger, tmp_path: Path, job_id: str, state: dict[str, Any]) -> Path:
    """A `--local` job's run folder with this supervisor state, in the ledger."""
    run_dir = tmp_path / job_id
    run_dir.mkdir()
    (run_dir / "local-state.json").write_text(json.dumps(state))
    ledger.add(
        JobRecord(
            job_id=job_id,
            backend="local",
            cluster=os.uname().nodename,
            name=job_id,
            run_dir=str(run_dir),
            config_digest="0",
            template="default",
        )
    )
    return run_dir


def wait_local(run_dir: Path, timeout: float = 60) -> LocalState:
    """Wait until a `--local` job's supervisor has recorded its end; its local state."""

    def ended() -> bool:
        state = read_local_state(RunDir(run_dir))
        return state is not None and state.state != "RUNNING"

    wait_for(ended, timeout, "the local job to end")
    state = read_local_state(RunDir(run_dir))
    assert state is not None
    return state


def mlflow_status(run_id: str, stoker_home: Path | None = None) -> str:
    """The status of a run in the default store of `stoker_home` ($STOKER_HOME)."""
    from mlflow.tracking import MlflowClient

    home = stoker_home or Path(os.environ["STOKER_HOME"])
    client = MlflowClient(f"sqlite:///{home / 'mlflow' / 'mlflow.db'}")
    return str(client.get_run(run_id).info.status)
