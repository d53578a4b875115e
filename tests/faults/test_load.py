"""Load (issue 8, item 6): 50 `stoker submit` and a 100-task `stoker sweep`, all started
at once on the local cluster from one fresh STOKER_HOME, so that the first of them
creates the ledger and the MLflow store while the others wait for it. Each command is a
process of its own, forked from one that has imported what they import
(tests/forked_commands.py).

Every job lands in the ledger and in MLflow with its tags, no command prints "database
is locked" or a traceback, every job completes, and one `stoker status` refresh over
the 150 rows takes at most 0.5 s of CPU. Then the retry itself, on sqlite files that another
connection keeps locked."""

from __future__ import annotations

import io
import itertools
import json
import os
import resource
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.targets import select_jobs
from stoker.launcher.slurm import cli as slurm_cli
from stoker.launcher.slurm.query import TERMINAL_STATES
from stoker.launcher.watch.status import collect_status
from stoker.sqlite_retry import DatabaseLockedError, is_locked_error, retry_while_locked
from tests.clirun import stoker_text
from tests.launcher_jobs import scontrol_job

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

FORKED_COMMANDS = Path(__file__).parents[1] / "forked_commands.py"
N_SUBMITS = 50
SEEDS = ",".join(str(seed) for seed in range(1, 11))
LRS = ",".join(f"{k}e-4" for k in range(1, 11))  # 10 seeds x 10 learning rates: 100 tasks
N_TASKS = 100
STATUS_REFRESH_S = 0.5  # the acceptance criterion, per refresh


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    def last_json(self) -> dict[str, Any]:
        return dict(json.loads(self.stdout.strip().splitlines()[-1]))


@dataclass
class Load:
    home: Path
    submits: list[Finished]
    sweep: Finished
    took_s: float

    @property
    def ledger(self) -> Ledger:
        return Ledger(self.home / "ledger.sqlite")

    def mlflow(self) -> Any:
        from mlflow.tracking import MlflowClient

        return MlflowClient(f"sqlite:///{self.home}/mlflow/mlflow.db")


@pytest.fixture(scope="module")
def load(slurm_cluster: ClusterSettings, tmp_path_factory: pytest.TempPathFactory) -> Load:
    root = tmp_path_factory.mktemp("load")
    home = root / "stoker-home"  # not there yet: the first command to get far creates it
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("STOKER_PROFILE", "XDG_CONFIG_HOME", "MLFLOW_TRACKING_URI")
    }
    env.update(HOME=str(root), STOKER_HOME=str(home))
    job = ["--time", "5", "--json", "--", "true"]  # `true`: the machine has 2 cores
    commands = [["submit", *job] for _ in range(N_SUBMITS)]
    commands.append(["sweep", f"train.seed={SEEDS}", f"optim.lr={LRS}", *job])
    (root / "commands.json").write_text(json.dumps(commands))
    outputs = root / "outputs"
    # A process per command, all forked at once from one that has imported theirs: the
    # race for the ledger and the store is theirs, without 51 interpreters' imports.
    started = time.monotonic()
    subprocess.run(
        [sys.executable, str(FORKED_COMMANDS), str(outputs), str(root / "commands.json")],
        cwd=root, env=env, timeout=900, check=True,
    )  # fmt: skip
    finished = []
    for index in range(len(commands)):
        code, out, err = (outputs / f"{index}.{kind}" for kind in ("code", "out", "err"))
        finished.append(Finished(int(code.read_text()), out.read_text(), err.read_text()))
    took = time.monotonic() - started
    print(f"\n{N_SUBMITS} submits and a {N_TASKS}-task sweep at once: {took:.1f} s")
    return Load(home, finished[:-1], finished[-1], took)


def _clean(result: Finished) -> None:
    assert result.returncode == 0, result.stderr
    assert "database is locked" not in result.stderr.lower(), result.stderr
    assert "Traceback" not in result.stderr, result.stderr


@pytest.mark.slurm
def test_fifty_submits_at_once_all_land_in_the_ledger_and_mlflow(load: Load) -> None:
    for result in load.submits:
        _clean(result)
    jobs = [result.last_json() for result in load.submits]
    assert len({job["job_id"] for job in jobs}) == N_SUBMITS
    records = {record.job_id: record for record in load.ledger.list()}
    client = load.mlflow()
    for job in jobs:
        record = records[job["job_id"]]
        assert (record.mlflow_run_id, record.run_dir) == (job["run_id"], job["run_dir"])
        run = client.get_run(job["run_id"])
        tags = run.data.tags
        assert tags["slurm.job_id"] == job["job_id"]
        assert tags["stoker.run_dir"] == job["run_dir"]
        assert tags["stoker.command"] == "true"
        assert run.data.params["job.time"] == "5"
        assert {a.path for a in client.list_artifacts(job["run_id"])} >= {
            "config.yaml",
            "job.sbatch",
        }
    experiment = client.get_experiment_by_name("stoker")
    every_run = client.search_runs([experiment.experiment_id], max_results=1000)
    assert len(every_run) == N_SUBMITS + 1 + N_TASKS  # no stray or duplicate run


@pytest.mark.slurm
def test_the_hundred_task_sweep_lands_in_the_ledger_and_mlflow(load: Load) -> None:
    _clean(load.sweep)
    job = load.sweep.last_json()
    record = load.ledger.require(job["job_id"])
    assert record.array_size == N_TASKS
    assert record.extra["child_run_ids"] == job["child_run_ids"]
    assert len(set(job["child_run_ids"])) == N_TASKS
    client = load.mlflow()
    parent = client.get_run(job["run_id"])
    assert parent.data.tags["slurm.job_id"] == job["job_id"]
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{job['run_id']}'",
        max_results=1000,
    )
    by_id = {child.info.run_id: child for child in children}
    assert set(by_id) == set(job["child_run_ids"])
    grid = set()
    for index, run_id in enumerate(job["child_run_ids"]):
        child = by_id[run_id]
        assert child.data.tags["stoker.sweep.index"] == str(index)
        assert child.data.tags["slurm.job_id"] == f"{job['job_id']}_{index}"
        grid.add((child.data.params["train.seed"], child.data.params["optim.lr"]))
    assert len(grid) == N_TASKS


def _reset_final_states(ledger: Ledger) -> None:
    """Every job active again, as in a `status --watch` while they run: each refresh then
    asks squeue and sacct about all of them and writes their final states back."""
    with sqlite3.connect(ledger.path) as conn:
        conn.execute("UPDATE jobs SET final_state = NULL")


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it waited for (squeue, sacct)."""
    own, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.mark.slurm
def test_a_status_refresh_over_150_rows_takes_at_most_half_a_second(load: Load) -> None:
    """The criterion is a refresh's own work: the CPU time of stoker and of its squeue
    and sacct clients. Its wall time on CI's 2-core VM, with the other test process
    beside it, also measures the neighbours (0.35-1.1 s seen for the same work), so
    that is bounded only loosely, to catch a sleep, a retry or a third SLURM call."""
    from rich.console import Console

    from stoker.cli.status import _rich_table

    ledger = load.ledger
    took = []
    for _ in range(5):
        _reset_final_states(ledger)
        slurm_cli.CALLS.clear()
        started, cpu_started = time.perf_counter(), _cpu_s()
        # What `refresh()` in stoker/cli/status.py does, once per `--watch` interval.
        rows = collect_status(select_jobs(ledger, all_jobs=True), ledger).rows
        queried, cpu = time.perf_counter(), _cpu_s() - cpu_started
        # Then --watch draws the table: timed for the record, not part of the criterion
        # (rich's layout of 150 rows: ~90 ms, up to ~500 ms on a loaded 2-core VM).
        Console(file=io.StringIO(), width=200, force_terminal=True).print(_rich_table(rows))
        took.append((queried - started, cpu, time.perf_counter() - queried))
        assert len(rows) == N_SUBMITS + N_TASKS
        assert dict(slurm_cli.CALLS) == {"squeue": 1, "sacct": 1}
    shown = [f"{wall * 1000:.0f} ms ({cpu * 1000:.0f} ms CPU)+{draw * 1000:.0f} ms"
             for wall, cpu, draw in took]  # fmt: skip
    # The first refresh also makes the 150 jobs' time accounts (once per job's end).
    print(f"\nstatus refresh over {len(rows)} rows (query+draw): {shown}")
    assert statistics.median(cpu for _, cpu, _ in took) <= STATUS_REFRESH_S, shown
    assert statistics.median(wall for wall, _, _ in took) <= 6 * STATUS_REFRESH_S, shown


@pytest.mark.slurm
def test_every_job_and_task_completes(load: Load) -> None:
    ledger = load.ledger
    deadline = time.monotonic() + 300
    while True:
        rows = collect_status(select_jobs(ledger, all_jobs=True), ledger).rows
        if all(row.state in TERMINAL_STATES for row in rows) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert len(rows) == N_SUBMITS + N_TASKS
    not_completed = {row.job_id: row.state for row in rows if row.state != "COMPLETED"}
    assert not not_completed, not_completed


@pytest.mark.slurm
def test_a_finished_job_requeued_with_hold_waits_for_its_release(load: Load) -> None:
    """`stoker requeue JOB --hold` (docs/jobs.md), on one of the jobs that just ended: back
    in the queue, held as SLURM says, until `scontrol release` (cancelled here instead)."""
    job_id = load.submits[0].last_json()["job_id"]
    env = {"HOME": str(load.home.parent), "STOKER_HOME": str(load.home)}
    result = stoker_text("requeue", job_id, "--hold", env=env)
    assert result.returncode == 0, result.stderr
    assert f"held it (`scontrol release {job_id}` starts it)" in result.stdout
    try:
        held = scontrol_job(job_id)
        assert held["JobState"] == "PENDING", held
        # Held: priority 0 (the scheduler never starts it), "job_requeued_in_held_state".
        assert held["Priority"] == "0" and "held" in held["Reason"], held
        assert load.ledger.require(job_id).final_state is None  # open again in the ledger
    finally:
        subprocess.run(["scancel", job_id], check=False, timeout=60)


# ---------------------------------------------------------------- the retry itself


@pytest.fixture
def held_lock(tmp_path: Path) -> Iterator[tuple[Path, threading.Event]]:
    """A ledger file and another connection's EXCLUSIVE transaction on it, held until
    the event is set (or the test ends)."""
    path = tmp_path / "ledger.sqlite"
    Ledger(path).add(JobRecord("1", "slurm", "c", "n", "/r", "h", "default"))
    release = threading.Event()
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    holder.execute("UPDATE jobs SET restarts = 1")

    def hold() -> None:
        release.wait(60)
        holder.execute("COMMIT")
        holder.close()

    thread = threading.Thread(target=hold)
    thread.start()
    yield path, release
    release.set()
    thread.join()


def test_a_locked_write_is_retried_until_the_lock_is_released(
    held_lock: tuple[Path, threading.Event],
) -> None:
    path, release = held_lock
    attempts = []

    def write() -> None:
        attempts.append(time.monotonic())
        conn = sqlite3.connect(path, timeout=0, isolation_level=None)  # no busy handler
        try:
            conn.execute("INSERT INTO jobs (job_id, backend, cluster, name, run_dir,"
                         " config_hash, template, submitted_at) VALUES"
                         " ('2', 'slurm', 'c', 'n', '/r', 'h', 'default', 0)")  # fmt: skip
        finally:
            conn.close()

    threading.Timer(1.0, release.set).start()
    started = time.monotonic()
    retry_while_locked(write, db=path, doing="add job 2", fix="wait", budget_s=30)
    took = time.monotonic() - started
    assert 1.0 <= took < 5.0, took
    assert len(attempts) >= 4  # backoff from 0.05 s: several tries in the first second
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert max(gaps) <= 2.0 + 0.5  # MAX_DELAY_S, plus a slow machine's slack
    assert {r.job_id for r in Ledger(path).list()} == {"1", "2"}


def test_the_ledger_waits_out_a_lock_longer_than_its_busy_timeout(
    held_lock: tuple[Path, threading.Event],
) -> None:
    path, release = held_lock
    ledger = Ledger(path, budget_s=4)  # sqlite waits 1 s per attempt, then stoker retries
    threading.Timer(2.5, release.set).start()
    started = time.monotonic()
    ledger.add(JobRecord("2", "slurm", "c", "n", "/r", "h", "default"))
    assert time.monotonic() - started >= 2.5
    assert ledger.require("1").restarts == 1  # the holder's write went in too
    assert ledger.require("2").name == "n"


def test_a_spent_budget_names_the_file_and_the_fix(
    held_lock: tuple[Path, threading.Event],
) -> None:
    path, _ = held_lock
    started = time.monotonic()
    with pytest.raises(DatabaseLockedError) as caught:
        Ledger(path, budget_s=0.5).add(JobRecord("2", "slurm", "c", "n", "/r", "h", "default"))
    assert time.monotonic() - started < 3.0
    message = str(caught.value)
    assert f"could not record job 2 in the job ledger: {path} stayed locked" in message
    assert "database is locked" in message  # the last error, for the curious
    assert "fix: other stoker commands kept it busy; try again" in message
    assert f"`fuser {path}` names the process" in message
    assert not is_locked_error(caught.value)  # an outer retry must not start over


def test_lock_errors_are_recognised_through_sqlalchemy_and_mlflow(
    held_lock: tuple[Path, threading.Event],
) -> None:
    import sqlalchemy
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    path, _ = held_lock
    engine = sqlalchemy.create_engine(f"sqlite:///{path}", connect_args={"timeout": 0})

    def mlflow_error(statement: str) -> MlflowException:
        # As MLflow's session maker wraps what SQLAlchemy raises (mlflow/store/db/utils.py).
        try:
            with engine.begin() as conn:
                conn.execute(sqlalchemy.text(statement))
        except sqlalchemy.exc.OperationalError as exc:
            try:
                raise MlflowException(message=exc, error_code=TEMPORARILY_UNAVAILABLE) from exc
            except MlflowException as wrapped:
                return wrapped
        raise AssertionError(f"{statement!r} did not fail")

    assert is_locked_error(mlflow_error("DELETE FROM jobs"))
    # Other operational errors fail at once: waiting would not fix them.
    assert not is_locked_error(mlflow_error("CREATE TABLE jobs (x)"))
    engine.dispose()


def test_an_mlflow_run_is_created_while_another_process_holds_the_store(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from stoker.tracking.runs import precreate_run
    from stoker.tracking.store import resolve_tracking_uri

    target = resolve_tracking_uri(None)
    args: dict[str, Any] = {"experiment": "load", "params": {"a": 1}, "artifacts": {}}
    precreate_run(target, run_name="first", tags={}, **args)  # the schema
    db = target.db_path
    assert db is not None
    holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")  # MLflow's file is in rollback mode: no reader gets in
    release = threading.Timer(1.5, holder.execute, args=("COMMIT",))
    release.start()
    started = time.monotonic()
    run = precreate_run(target, run_name="second", tags={"t": "1"}, **args)
    assert time.monotonic() - started >= 1.5
    release.join()
    holder.close()

    from mlflow.tracking import MlflowClient

    created = MlflowClient(target.uri).get_run(run.run_id)
    assert created.data.tags["t"] == "1" and created.info.status == "SCHEDULED"
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err and "locked" not in captured.err, captured.err


@pytest.mark.slurm
def test_a_job_queued_while_the_ledger_stays_locked_keeps_its_folder_and_says_so(
    slurm_cluster: ClusterSettings,
    held_lock: tuple[Path, threading.Event],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from stoker.config import resolve_config
    from stoker.launcher.launch import submit as submit_module
    from tests.launcher_jobs import wait_final

    path, release = held_lock
    monkeypatch.setattr(submit_module, "Ledger", lambda: Ledger(path, budget_s=0.5))
    options = submit_module.SubmitOptions(command=["true"], cwd=tmp_path)
    with pytest.raises(submit_module.NotRecordedError) as caught:
        submit_module.submit(resolve_config(overrides=["job.time=5"]), options)
    release.set()
    message = str(caught.value)
    job_id = message.split()[1]
    assert message.startswith(f"job {job_id} was submitted and will run, but it is not in")
    assert f"{path} stayed locked" in message and f"squeue -j {job_id}" in message
    run_dir = Path(message.split("in its run folder ")[1].split(";")[0])
    assert (run_dir / "job.sbatch").is_file()  # the job reads its script and config there
    assert wait_final(job_id) == "COMPLETED"
