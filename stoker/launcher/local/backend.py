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
import random
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


# The rendezvous ports, as the batch script chooses them (base.sbatch.j2): from here up
# to the kernel's ephemeral range.
FIRST_RENDEZVOUS_PORT = 20000


def rendezvous_port() -> int:
    """A port for the ranks' rendezvous that binds now, drawn below the kernel's
    ephemeral range: a port from that range (what binding port 0 gives) can be taken by
    any process's outgoing connection between now and rank 0's listen, seconds later
    (seen in the suite: rank 0's EADDRINUSE, the job failed)."""
    span = _ephemeral_low() - FIRST_RENDEZVOUS_PORT
    if span < 1000:  # no room below the range (a tuned kernel): as the batch script
        span = 20000
    for _ in range(64):
        port = FIRST_RENDEZVOUS_PORT + random.randrange(span)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    with socket.socket() as sock:  # every draw taken: the kernel's choice
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


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
            "MASTER_PORT": str(rendezvous_port()),
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
    _spawn_supervisor(run_dir, spec.workdir)


def _spawn_supervisor(run_dir: RunDir, workdir: Path | str) -> None:
    """Start the supervisor of the plan in the run folder; return once it has written
    its state."""
    run_dir.logs.mkdir(parents=True, exist_ok=True)
    with open(run_dir.batch_log, "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "stoker.launcher.local.supervisor", str(run_dir.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # survives the CLI; Ctrl-C in the shell does not reach it
            cwd=workdir,
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


def requeue_local(run_dir: Path) -> int:
    """Run a local job again in its own run folder, as SLURM requeues a job: restart
    N+1 (STOKER_RESTART, logs/r<N+1>/), so a command that saves in the run folder (the
    stoker runtime's default checkpoint.root) continues from there. A running job is
    stopped first. Returns the restart's number."""
    from stoker.launcher.local.state import read_local_state
    from stoker.tracking.run_end import MARK_FILE

    run = RunDir(run_dir)
    try:
        plan = json.loads((run.path / LAUNCH_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise StokerError(
            f"cannot run local job again: {run.path / LAUNCH_FILE} is unreadable ({exc})",
            fix="submit it again with `stoker submit --local`",
        ) from exc
    if cancel_local(run.path):
        deadline = time.monotonic() + 60
        while (state := read_local_state(run)) is not None and state.state == "RUNNING":
            if time.monotonic() > deadline:
                raise StokerError(
                    f"local job {plan['job_id']} did not stop within 60 s; see {run.batch_log}"
                )
            time.sleep(0.1)
    restart = run.restarts() + 1
    plan["restart"] = restart
    port = str(rendezvous_port())
    for rank in plan["ranks"]:
        rank["env"].update({ENV_RESTART: str(restart), "MASTER_PORT": port})
        rank["log"] = str(run.rank_log(restart, rank["rank"]))
    # The previous start's end, stop request and ended MLflow run are not this start's.
    for stale in (run.local_state, run.stop_flag, run.path / MARK_FILE):
        stale.unlink(missing_ok=True)
    write_text_atomic(run.path / LAUNCH_FILE, json.dumps(plan, indent=2))
    _spawn_supervisor(run, plan["workdir"])
    return restart
