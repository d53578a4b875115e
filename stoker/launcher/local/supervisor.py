"""The supervisor of a `--local` job: `python -m stoker.launcher.local.supervisor RUN_DIR`.

Its own output is the job's logs/batch.log. It writes local-state.json
(stoker/launcher/local/state.py) before the first rank starts and after the last one ends,
and then ends the job's MLflow run in the job's state if no rank did.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.local.backend import LAUNCH_FILE
from stoker.launcher.local.state import write_local_state
from stoker.protocol import EXIT_PEER_LOST

KILL_WAIT_S = 5.0  # as SLURM's KillWait: TERM, then KILL


def _stop(procs: dict[int, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(0.05)
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def supervise(run_dir: Path) -> int:
    plan = json.loads((run_dir / LAUNCH_FILE).read_text())
    state: dict[str, Any] = {
        "state": "RUNNING",
        "exit_code": None,
        "supervisor_pid": os.getpid(),
        "started": time.time(),
        "ended": None,
        "ranks": {str(r["rank"]): None for r in plan["ranks"]},
    }
    cancelled = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal cancelled
        cancelled = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    write_local_state(RunDir(run_dir), state)
    with open(run_dir / "attempts", "a") as attempts:
        restart = plan.get("restart", 0)  # `stoker requeue` of a local job: 1, 2, ...
        start = f"restart={restart} job={plan['job_id']} nodes=localhost"
        start += " how=requeue" if restart else " how=start"
        attempts.write(f"{int(time.time())} {start}\n")
    # As the batch script does: where this start's part of batch.log begins.
    print(f"stoker: start {start}", flush=True)

    # Setup lines run in the rank's shell, as in the batch script; the command is "$@".
    script = "\n".join([*plan["setup"], 'exec "$@"'])
    procs: dict[int, subprocess.Popen[bytes]] = {}
    for rank in plan["ranks"]:
        log_path = Path(rank["log"])
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            procs[rank["rank"]] = subprocess.Popen(
                ["bash", "-c", script, "stoker-task", *plan["argv"]],
                env={**os.environ, **rank["env"]},
                cwd=plan["workdir"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stop kills its children too
            )

    exit_code = 0
    while True:
        if cancelled:
            print(f"stoker: job {plan['job_id']} cancelled", flush=True)
            _stop(procs)
            break
        running = False
        failed: dict[int, int] = {}  # rank -> exit code, of the ranks found failed now
        for rank, proc in procs.items():
            code = proc.poll()
            if code is None:
                running = True
            elif state["ranks"][str(rank)] is None:
                state["ranks"][str(rank)] = code
                if code != 0:
                    failed[rank] = code
        for rank in first_failures(failed):
            # Worded as srun words it, so `stoker why` reads both the same way: the first
            # line names the rank that failed first.
            print(f"local: error: task {rank}: Exited with exit code {failed[rank]}", flush=True)
            code = failed[rank]
            exit_code = exit_code or (code if code > 0 else 128 - code)
        if failed:
            _stop(procs)
            break
        if not running:
            break
        time.sleep(0.1)
    for rank, proc in procs.items():
        if state["ranks"][str(rank)] is None:
            state["ranks"][str(rank)] = proc.returncode
    state["exit_code"] = exit_code
    state["state"] = "CANCELLED" if cancelled else ("FAILED" if exit_code else "COMPLETED")
    state["ended"] = time.time()
    # Before the state file says "ended": who waits for it finds the run ended too.
    _end_run(plan, state["state"], run_dir)
    state["cpu_s"] = round(_cpu_seconds(), 2)
    write_local_state(RunDir(run_dir), state)
    return exit_code


def _cpu_seconds() -> float:
    """The job's CPU seconds as sacct's TotalCPU counts a SLURM job's: this supervisor's
    and its ranks' (all reaped by now), with what each rank waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    ranks = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + ranks.ru_utime + ranks.ru_stime


def first_failures(failed: dict[int, int]) -> list[int]:
    """The ranks found failed in one poll (rank -> exit code), in the order they are
    reported: a rank whose peer went away exits EXIT_PEER_LOST as a consequence, so when
    the rank that failed first ended in the same poll (a loaded machine polls late), it
    comes first, as it would if the polls saw them one by one; by rank otherwise."""
    return sorted(failed, key=lambda rank: (failed[rank] == EXIT_PEER_LOST, rank))


def _end_run(plan: dict[str, Any], job_state: str, run_dir: Path) -> None:
    """End the job's MLflow run in the job's state unless a rank did (stoker/tracking/run_end.py):
    a rank stopped because its peer failed, or a command that is not the stoker runtime,
    leaves it open."""
    env = plan["ranks"][0]["env"] if plan["ranks"] else {}
    run_id = env.get("MLFLOW_RUN_ID")
    if run_id:
        from stoker.tracking.run_end import MARK_FILE
        from stoker.tracking.run_end import main as end_run

        mark = str(run_dir / MARK_FILE)
        end_run([env.get("MLFLOW_TRACKING_URI", ""), run_id, job_state, mark])


if __name__ == "__main__":
    sys.exit(supervise(Path(sys.argv[1])))
