"""stoker from Python, on a login node: submit a job, watch it, read its logs, ask why it
ended, cancel it. The CLI's commands do the same through the same launcher code.

    import stoker

    job = stoker.submit("exp.yaml", ["train.steps=2000"], nodes=2, gpus_per_node=8)
    print(job.job_id, job.run_id)
    state = job.wait(timeout=3600)          # "COMPLETED", "FAILED", ...
    if state != "COMPLETED":
        print(job.why()["summary"])
    print(job.logs(rank=0)[-20:])

    for job in stoker.jobs():               # the ledger, newest first
        print(job.job_id, job.state())

    tasks = stoker.sweep("exp.yaml", ["optim.lr=1e-4,3e-4", "train.steps=500"])
    print([task.wait() for task in tasks])  # one Job per task of the job array

    def add(a, b):
        return a + b

    job = stoker.submit(add, 2, 3, nodes=1)  # a Python function as a job (submitit's)
    print(job.result())                     # 5, once it has run; raises what it raised

Importing this module (or `stoker`) imports no torch, mlflow or submitit. Errors are
`stoker.errors.StokerError`, with the value, where it came from and the fix, as the
CLI prints them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stoker.errors import StokerError

POLL_S = 2.0


class FunctionJobError(StokerError):
    """A function job's function raised: the message holds its traceback, as the task
    printed it (global rank 0's)."""


@dataclass(frozen=True)
class Job:
    """A submitted job: its ids and run folder; each method asks SLURM (or the local
    supervisor) afresh."""

    job_id: str
    run_id: str | None
    run_dir: Path

    def state(self) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ... (`stoker status`)."""
        return str(self._status()["state"])

    def status(self) -> dict[str, Any]:
        """The job's `stoker status --json` row: state, reason, step, loss, ETA, ..."""
        return self._status()

    def wait(self, timeout: float | None = None, poll_s: float = POLL_S) -> str:
        """Until the job has ended for good (a requeued job has not); its final state.
        TimeoutError after `timeout` seconds."""
        from stoker.launcher.slurm.query import TERMINAL_STATES

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.state()
            if state in TERMINAL_STATES or state in ("KILLED", "ENDED"):
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {self.job_id} is still {state} after {timeout} s")
            time.sleep(poll_s)

    def logs(self, rank: int | None = None, restart: int | None = None) -> list[str]:
        """The job's log lines as `stoker logs` prints them (`[rank] line`, the batch
        script's lines, a separator per restart); one rank's or one start's."""
        from stoker.launcher.watch.logs import LogFilter, LogReader

        lines: list[str] = []
        target = self._target()
        wanted = LogFilter(rank=rank, restart=restart)
        LogReader(target.run, wanted, lines.append).snapshot(final=True)
        return lines

    def why(self) -> dict[str, Any]:
        """`stoker why --json`: how it ended or why it waits, the evidence and the fix."""
        from stoker.launcher.jobs.ledger import Ledger
        from stoker.launcher.watch.job_end import Ended, settle
        from stoker.launcher.why import diagnose

        target = self._target()
        diagnosis = diagnose(target)
        settle(Ledger(), [Ended(target, diagnosis.state)], {target.job_id: diagnosis})
        return dict(diagnosis.to_json())

    def result(self, timeout: float | None = None, poll_s: float = POLL_S) -> Any:
        """A function job's return value (`stoker.submit(fn, ...)`), once it has ended
        for good: what global rank 0's call returned. FunctionJobError, with the remote
        traceback, when it raised; StokerError when the job ended without a result
        (cancelled, out of time, not a function job). TimeoutError as `wait`."""
        from stoker.protocol import FUNCTION_DIR, RESULT_FILE

        state = self.wait(timeout, poll_s)
        path = self.run_dir / FUNCTION_DIR / RESULT_FILE
        if not path.is_file():
            what = "is not a function job" if not path.parent.is_dir() else f"ended {state}"
            raise StokerError(
                f"job {self.job_id} {what}: it has no result ({path})",
                fix=f"see `stoker why {self.job_id}`",
            )
        from submitit.core.utils import pickle_load

        outcome, value = pickle_load(path)
        if outcome == "error":
            raise FunctionJobError(
                f"job {self.job_id}'s function raised (global rank 0):\n{str(value).rstrip()}",
                fix=f"`stoker logs {self.job_id}` has every rank's output",
            )
        return value

    def cancel(self) -> str:
        """Cancel it (`stoker cancel`); what was done, in words."""
        from stoker.launcher.control import cancel

        return cancel(self.job_id)

    def _target(self) -> Any:
        from stoker.launcher.jobs.targets import resolve_job

        return resolve_job(self.job_id, command="status")

    def _status(self) -> dict[str, Any]:
        from stoker.launcher.jobs.ledger import Ledger
        from stoker.launcher.watch.status import collect_status

        ledger = Ledger()
        report = collect_status([self._target()], ledger)
        (row,) = report.rows
        return dict(row.to_json())


def submit(
    experiment: str | Path | Callable[..., Any] | None = None,
    *args: Any,
    overrides: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
    command: Sequence[str] = (),
    nodes: int | None = None,
    ntasks_per_node: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    mem: str | None = None,
    time: str | None = None,
    partition: str | None = None,
    name: str | None = None,
    after: str | None = None,
    local: bool = False,
    code: str | Path | None = None,
    snapshot: bool = True,
    check: bool = True,
    cwd: str | Path | None = None,
    profile: str | Path | None = None,
    use_profile: bool = True,
) -> Job:
    """Submit an experiment (or `command` under it) as `stoker submit` does, and return
    at once: `submit("exp.yaml", ["train.steps=500"], nodes=2)`. `overrides` are
    `key=value` strings (the second positional argument, or by keyword); the keyword
    arguments are the command's flags (`nodes` is `--nodes`), with the same precedence.
    `cwd`: the folder to snapshot and run from (default: the current one); a relative
    path in `overrides` is relative to this process's current folder, one in the
    experiment file to the file's folder. `check=False` is `--no-check`. A local data
    set or a `python X.py` script that is not there is refused, as `stoker submit` does.

    Or a Python function, as submitit submits one: `submit(fn, *args, kwargs={...},
    nodes=...)` pickles the call (submitit's DelayedSubmission) into the run folder;
    every task calls it (stoker/runtime/function_task.py) and `Job.result()` gives
    global rank 0's return value, or raises what it raised. A submitit `Checkpointable`
    is asked for its `checkpoint()` on a stop, and the job is requeued to continue from
    it. `overrides` set job.* keys; the job is named after the function."""
    from stoker.config import resolve_config
    from stoker.launcher.launch.job_flags import JobFlags, keyword
    from stoker.launcher.launch.submit import SubmitOptions
    from stoker.launcher.launch.submit import submit as launch

    function = experiment if callable(experiment) else None
    if function is None:
        if len(args) > 1 or (args and overrides):
            raise StokerError(
                f"submit({experiment!r}, ...) takes the overrides once, as a list",
                fix="submit(EXP, [KEY=VALUE, ...], nodes=...); only a function job takes "
                "its function's arguments after it",
            )
        if args:
            overrides = args[0]
    elif kwargs is not None and not isinstance(kwargs, Mapping):
        raise StokerError(f"kwargs={kwargs!r} is not a mapping", fix="pass kwargs={'name': value}")
    if function is not None and name is None:
        name = _job_name_of(function)
    flags = JobFlags(
        nodes=nodes,
        ntasks_per_node=ntasks_per_node,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        mem=mem,
        time=time,
        partition=partition,
        name=name,
    ).for_config(keyword)
    if isinstance(overrides, str):
        raise StokerError(
            f"overrides={overrides!r} is one string", fix=f"pass a list: [{overrides!r}]"
        )
    resolved = resolve_config(
        Path(experiment) if isinstance(experiment, (str, Path)) else None,
        list(overrides),
        flags,
        profile=Path(profile) if profile is not None else None,
        use_profile=use_profile,
    )
    files: dict[str, bytes] = {}
    if function is not None:
        if command:
            raise StokerError("a function job runs its function", fix="drop command=")
        command, files = _function_call(function, args, dict(kwargs or {}), resolved)
    options = SubmitOptions(
        command=list(command),
        after=after,
        local=local,
        code=Path(code) if code is not None else None,
        snapshot=snapshot,
        check=check,
        cwd=Path(cwd) if cwd is not None else Path.cwd(),
        files=files,
    )
    done = launch(resolved, options)
    return Job(done.job_id, done.run_id, Path(done.run_dir))


def _function_call(
    function: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any], resolved: Any
) -> tuple[list[str], dict[str, bytes]]:
    """The task command of a function job and its pickled call (submitit's
    DelayedSubmission, cloudpickle: a function of __main__ travels by value, one of an
    importable module by name, imported from the job's code snapshot)."""
    import sys

    import cloudpickle
    from submitit.helpers import DelayedSubmission

    from stoker.protocol import FUNCTION_DIR, FUNCTION_MODULE, SUBMISSION_FILE

    try:
        data = cloudpickle.dumps(DelayedSubmission(function, *args, **kwargs))
    except Exception as exc:
        raise StokerError(
            f"cannot pickle the call of {getattr(function, '__qualname__', function)!r}: "
            f"{type(exc).__name__}: {exc}",
            fix="pass arguments that pickle (no open files, locks or live connections); "
            "open those inside the function",
        ) from exc
    python = "python" if resolved.config.job.container else sys.executable
    return [python, "-m", FUNCTION_MODULE], {f"{FUNCTION_DIR}/{SUBMISSION_FILE}": data}


def _job_name_of(function: Callable[..., Any]) -> str:
    """The function's name as a job name (letters, digits, . _ -)."""
    import re

    raw = getattr(function, "__name__", None) or type(function).__name__
    return re.sub(r"[^A-Za-z0-9._-]", "-", raw).strip("-.") or "function"


def sweep(
    experiment: str | Path | None,
    axes: Sequence[str],
    *,
    command: Sequence[str] = (),
    max_parallel: int | None = None,
    nodes: int | None = None,
    ntasks_per_node: int | None = None,
    gpus_per_node: int | None = None,
    cpus_per_task: int | None = None,
    mem: str | None = None,
    time: str | None = None,
    partition: str | None = None,
    name: str | None = None,
    after: str | None = None,
    code: str | Path | None = None,
    snapshot: bool = True,
    check: bool = True,
    cwd: str | Path | None = None,
    profile: str | Path | None = None,
    use_profile: bool = True,
) -> list[Job]:
    """Submit a grid as one job array, as `stoker sweep` does: `axes` are `KEY=V1,V2`
    sweep axes and `KEY=V` overrides every task shares (every task's model is checked
    first unless `check=False`). One `Job` per task (`JOB_<index>`), in the order of the
    grid, each with its own MLflow run (children of one parent run)."""
    from stoker.launcher.launch.job_flags import JobFlags, keyword
    from stoker.launcher.launch.submit import SubmitOptions
    from stoker.launcher.launch.sweep import submit_sweep

    if isinstance(axes, str):
        raise StokerError(f"axes={axes!r} is one string", fix=f"pass a list: [{axes!r}]")
    flags = JobFlags(
        nodes=nodes,
        ntasks_per_node=ntasks_per_node,
        gpus_per_node=gpus_per_node,
        cpus_per_task=cpus_per_task,
        mem=mem,
        time=time,
        partition=partition,
        name=name,
    ).for_config(keyword)
    options = SubmitOptions(
        command=list(command),
        after=after,
        code=Path(code) if code is not None else None,
        snapshot=snapshot,
        max_parallel=max_parallel,
        check=check,
        cwd=Path(cwd) if cwd is not None else Path.cwd(),
    )
    _, done = submit_sweep(
        Path(experiment) if experiment is not None else None,
        list(axes),
        flags,
        options,
        profile=Path(profile) if profile is not None else None,
        use_profile=use_profile,
    )
    run_dir = Path(done.run_dir)
    return [
        # A run id is "" with tracking.uri none (no MLflow runs).
        Job(f"{done.job_id}_{index}", run_id or None, run_dir / "tasks" / str(index))
        for index, run_id in enumerate(done.child_run_ids)
    ]


def jobs(limit: int | None = None) -> list[Job]:
    """The jobs in the ledger (`stoker status --all`), newest first."""
    from stoker.launcher.jobs.ledger import Ledger

    return [Job(r.job_id, r.mlflow_run_id, Path(r.run_dir)) for r in Ledger().list(limit=limit)]
