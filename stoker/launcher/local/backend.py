"""`stoker submit --local`: the same launch as on SLURM, as processes on this machine.

Same variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, STOKER_*,
MLFLOW_*), same log layout (logs/r0/rank-<r>.log), same ledger entry. A detached
supervisor (`python -m stoker.launcher.local.supervisor RUN_DIR`) starts the ranks,
kills the others when one fails (like `srun --kill-on-bad-exit=1`) and records the
outcome in `local-state.json`, which `status`, `why` and `cancel` read.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stoker.atomic_write import write_text_atomic
from stoker.errors import StokerError
from stoker.launcher.jobs.ledger import Ledger
from stoker.launcher.jobs.rundir import RunDir
from stoker.launcher.script.render import ENV_DEFAULTS
from stoker.launcher.script.spec import LaunchSpec
from stoker.protocol import (
    ENV_CONFIG,
    ENV_JOB_ID,
    ENV_PROGRESS_FILE,
    ENV_RESTART,
    ENV_RUN_DIR,
    ENV_STOP_FILE,
)

LAUNCH_FILE = "local-launch.json"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch_plan(spec: LaunchSpec, job_id: str) -> dict[str, Any]:
    """What the supervisor starts: one argv and environment per rank."""
    if spec.array_size:
        raise StokerError(
            "a sweep cannot run with --local: it is a SLURM job array",
            fix="submit the sweep to SLURM, or run its configs one by one with --local",
        )
    job = spec.config.job
    run_dir = RunDir(spec.run_dir)
    per_node = job.tasks_per_node
    world = job.nodes * per_node
    base_env = {name: value for name, value in ENV_DEFAULTS if name not in os.environ}
    base_env.update(job.env)
    base_env.update(
        {
            ENV_RUN_DIR: str(run_dir.path),
            ENV_JOB_ID: job_id,
            ENV_RESTART: "0",
            ENV_STOP_FILE: str(run_dir.stop_flag),
            ENV_PROGRESS_FILE: str(run_dir.progress),
            ENV_CONFIG: str(run_dir.config),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
            "WORLD_SIZE": str(world),
            # "" without MLflow (tracking.uri none): no run for the supervisor to end.
            "MLFLOW_RUN_ID": spec.mlflow_run_ids[0],
        }
    )
    if spec.tracking_uri:
        base_env["MLFLOW_TRACKING_URI"] = spec.tracking_uri
    # `"$STOKER_CONFIG"` in the training command is shell; here there is no shell.
    argv = [str(run_dir.config) if a == '"$STOKER_CONFIG"' else str(a) for a in spec.command]
    ranks = []
    for rank in range(world):
        ranks.append(
            {
                "rank": rank,
                "env": {
                    **base_env,
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank % per_node),
                    "NODE_RANK": str(rank // per_node),
                },
                "log": str(run_dir.rank_log(0, rank)),
            }
        )
    return {
        "job_id": job_id,
        "argv": argv,
        "setup": list(job.setup),
        "workdir": str(spec.workdir),
        "ranks": ranks,
    }


def start_local(spec: LaunchSpec, ledger: Ledger) -> str:
    """Start the supervisor and return the job id at once."""
    job_id = ledger.reserve_local_id()
    try:
        _start_supervisor(spec, job_id)
    except BaseException:
        ledger.remove(job_id)  # the placeholder row must not outlive a failed start
        raise
    return job_id


def _start_supervisor(spec: LaunchSpec, job_id: str) -> None:
    run_dir = RunDir(spec.run_dir)
    plan = launch_plan(spec, job_id)
    write_text_atomic(run_dir.path / LAUNCH_FILE, json.dumps(plan, indent=2))
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    with open(run_dir.batch_log, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "stoker.launcher.local.supervisor", str(run_dir.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI; Ctrl-C in the shell does not reach it
            cwd=spec.workdir,
        )
    # The supervisor writes its state before it starts any rank.
    deadline = time.monotonic() + 10
    while not run_dir.local_state.exists():
        if time.monotonic() > deadline:
            raise StokerError(
                f"the local supervisor did not start; see {run_dir.batch_log}",
            )
        time.sleep(0.02)


def cancel_local(run_dir: Path) -> bool:
    """Send the supervisor SIGTERM; it stops the ranks. False when it is not running:
    also when it died and its pid now belongs to a younger process, which must not get
    the signal (pids wrap around in minutes on a busy machine)."""
    from stoker.launcher.local.state import process_alive, read_local_state

    state = read_local_state(RunDir(run_dir))
    if state is None or state.state != "RUNNING" or state.supervisor_pid is None:
        return False
    if not process_alive(state.supervisor_pid, state.started):
        return False
    try:
        os.kill(state.supervisor_pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    return True
