"""RunLogger against a real `mlflow server` that the tests stop and restart (same port,
same sqlite store), and against a sqlite store opened directly."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from stoker.tracking.logger import RunLogger
from stoker.tracking.runs import precreate_run
from stoker.tracking.store import resolve_tracking_uri
from stoker.tracking.system_metrics import SystemSampler
from tests.mlflow_server import RestartableServer, free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client(server: RestartableServer) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=server.url)


pytestmark = pytest.mark.usefixtures("mlflow_http_env")


def new_run(client: Any) -> str:
    """A run as `stoker submit` leaves it: SCHEDULED."""
    found = client.get_experiment_by_name("run-logger")
    experiment_id = found.experiment_id if found else client.create_experiment("run-logger")
    run_id = str(client.create_run(experiment_id).info.run_id)
    client.update_run(run_id, status="SCHEDULED")
    return run_id


def steps_of(client: Any, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def assert_each_step_once(client: Any, run_id: str, keys: list[str], steps: range) -> None:
    for key in keys:
        logged = steps_of(client, run_id, key)
        repeated = {s: n for s, n in Counter(logged).items() if n > 1}
        assert not repeated, f"{key}: steps logged more than once: {repeated}"
        assert logged == list(steps), f"{key}: missing {sorted(set(steps) - set(logged))[:20]}"


def test_store_outage_does_not_stop_training_and_loses_nothing(
    server: RestartableServer, client: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_id = new_run(client)
    spool = tmp_path / "spool.jsonl"
    logger = RunLogger(server.url, run_id, spool, flush_interval_s=0.2, retry_max_s=1.0)
    logger.start()
    assert client.get_run(run_id).info.status == "RUNNING"

    back = threading.Event()
    durations: list[float] = []
    last_step = [0]

    def train() -> None:
        step, after_back = 0, 0
        while after_back < 40:  # some steps go straight to the store once it is back
            started = time.perf_counter()
            logger.log_metrics({"loss": 1.0 / (step + 1), "lr": 3e-4, "grad_norm": step}, step)
            durations.append(time.perf_counter() - started)
            last_step[0] = step
            step += 1
            after_back += back.is_set()
            time.sleep(0.01)

    trainer = threading.Thread(target=train)
    trainer.start()
    time.sleep(0.6)
    server.stop()  # mid-run, possibly mid-request
    time.sleep(1.0)
    server.start()
    back.set()
    trainer.join()
    logger.close("FINISHED")

    # The trainer never waited on the store: a call that did would take the client's
    # retries and timeouts (seconds). The bound leaves room for a busy 2-core machine (34 ms
    # seen beside the cluster tests; ~0.3 ms quiet).
    with capfd.disabled():
        print(f"\nlongest log_metrics call: {max(durations) * 1e3:.2f} ms of {len(durations)}")
    assert max(durations) < 0.5
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_each_step_once(client, run_id, ["loss", "lr", "grad_norm"], range(last_step[0] + 1))
    stats = logger.stats()
    assert (stats.queued, stats.spooled, logger.pending()) == (0, 0, 0)
    assert stats.outages == 1
    assert spool.read_text() == ""
    err = capfd.readouterr().err
    assert err.count("does not answer") == 1, err
    assert f"{server.url}" in err and str(spool) in err
    (back_line,) = [line for line in err.splitlines() if "answers again" in line]
    assert int(back_line.split("replayed ")[1].split()[0]) > 0, back_line


def test_requeued_job_logs_every_step_once_and_params_again(
    server: RestartableServer, client: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_id = new_run(client)
    spool = tmp_path / "spool.jsonl"
    note = tmp_path / "note.txt"
    note.write_text("attempt 1\n")

    first = RunLogger(server.url, run_id, spool, flush_interval_s=0.1)
    first.start()
    first.log_params({"lr": 3e-4, "model": "dit-s"})
    first.set_tags({"stoker.attempt": "1"})
    first.log_artifact(note, "notes")
    for step in range(31):
        loss = math.nan if step == 7 else float(step)  # the trainer's business, logged as is
        first.log_metrics({"loss": loss, "acc": step / 100}, step)
    first.close(None)
    assert client.get_run(run_id).info.status == "RUNNING"

    # Attempt 2 resumes from the checkpoint at step 20: steps 20..30 come again.
    second = RunLogger(server.url, run_id, spool, flush_interval_s=0.1)
    second.start()
    second.log_params({"lr": 3e-4, "model": "dit-s"})  # equal values: no error
    second.log_params({"lr": 1e-3})  # another value: a warning, no exception
    second.log_params({"lr": 1e-3})
    second.set_tags({"stoker.attempt": "2"})
    for step in range(20, 51):
        second.log_metrics({"loss": 1000.0 + step, "acc": step / 100}, step)
    second.close("FINISHED")

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert_each_step_once(client, run_id, ["loss", "acc"], range(51))
    loss_at = {m.step: m.value for m in client.get_metric_history(run_id, "loss")}
    assert math.isnan(loss_at[7])
    assert loss_at[25] == 25.0  # the first value of a step wins
    assert loss_at[40] == 1040.0
    assert run.data.params == {"lr": "0.0003", "model": "dit-s"}
    assert run.data.tags["stoker.attempt"] == "2"
    assert [a.path for a in client.list_artifacts(run_id, "notes")] == ["notes/note.txt"]
    assert second.stats().dropped == 2 * 11
    err = capfd.readouterr().err
    assert err.count("param 'lr'") == 1, err


CRASHING_JOB = """
import sys, time
from pathlib import Path
from stoker.tracking.logger import RunLogger

url, run_id, spool = sys.argv[1:]
logger = RunLogger(url, run_id, Path(spool), flush_interval_s=0.1, retry_max_s=0.5)
logger.start()
logger.log_params({"seed": 1})
for step in range(40):
    logger.log_metrics({"loss": float(step), "tokens": 2.0 * step}, step)
deadline = time.monotonic() + 30
while logger.stats().spooled < 80 and time.monotonic() < deadline:
    time.sleep(0.05)
print("spooled", logger.stats().spooled, flush=True)
time.sleep(600)  # killed here, as SLURM kills a job: no close()
"""


def test_job_killed_while_the_store_is_down_is_replayed_by_the_next_attempt(
    server: RestartableServer, client: Any, tmp_path: Path
) -> None:
    run_id = new_run(client)
    spool = tmp_path / "spool.jsonl"
    # The dead attempt's store is down: nothing listens at its URL. (Stopping and
    # restarting the server would cost another start, 6 to 20 s here; the client sees
    # the same refused connection, and the URL may change between attempts anyway.)
    down_url = f"http://127.0.0.1:{free_port()}"
    job = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(CRASHING_JOB), down_url, run_id, str(spool)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert job.stdout is not None
    line = job.stdout.readline()
    job.send_signal(signal.SIGKILL)
    _, stderr = job.communicate(timeout=10)
    assert line.split() == ["spooled", "80"], stderr
    assert "does not answer" in stderr
    records = [json.loads(line) for line in spool.read_text().splitlines()]
    assert sum(len(r.get("m", ())) for r in records) == 80
    assert {r["run"] for r in records} == {run_id}

    second = RunLogger(server.url, run_id, spool, flush_interval_s=0.1)
    second.start()  # replays the dead attempt's spool
    assert spool.read_text() == ""
    assert second.stats().sent == 80
    assert steps_of(client, run_id, "loss") == list(range(40))
    for step in range(30, 60):  # resumed from a checkpoint at step 30
        second.log_metrics({"loss": float(step), "tokens": 2.0 * step}, step)
    second.close("FINISHED")
    assert_each_step_once(client, run_id, ["loss", "tokens"], range(60))
    run = client.get_run(run_id)
    assert (run.info.status, run.data.params) == ("FINISHED", {"seed": "1"})


def test_close_keeps_what_the_store_did_not_take_in_the_spool(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    down_url = f"http://127.0.0.1:{free_port()}"
    spool = tmp_path / "spool.jsonl"
    logger = RunLogger(down_url, "0" * 32, spool, flush_interval_s=0.1, retry_max_s=0.2)
    logger.start()  # the store does not answer: not an error
    for step in range(10):
        logger.log_metrics({"loss": float(step)}, step)
    started = time.monotonic()
    logger.close("FINISHED", timeout_s=0.5)
    assert time.monotonic() - started < 3
    assert logger.stats().spooled == logger.pending() == 10
    assert sum(len(json.loads(line)["m"]) for line in spool.read_text().splitlines()) == 10
    err = capfd.readouterr().err
    assert "10 points stay in" in err and str(spool) in err and "not FINISHED" in err, err


def test_sqlite_store(server: RestartableServer, tmp_path: Path) -> None:
    # The server's own sqlite file, opened directly as a job on a shared filesystem
    # would: a fresh store's schema takes 5 to 8 s to create here.
    uri = server.db_uri
    run_id = precreate_run(
        resolve_tracking_uri(uri),
        experiment="local",
        run_name="first",
        params={"lr": 0.1},
        tags={"stoker.command": "run"},
        artifacts={},
    ).run_id
    logger = RunLogger(uri, run_id, tmp_path / "spool.jsonl", flush_interval_s=0.1)
    logger.start()
    logger.log_params({"lr": 0.1, "steps": 100})
    for step in range(100):
        logger.log_metrics({"loss": 1.0 / (step + 1)}, step)
    logger.close("FINISHED")

    from mlflow.tracking import MlflowClient

    store = MlflowClient(tracking_uri=uri)
    run = store.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.1", "steps": "100"}
    assert run.data.tags["stoker.command"] == "run"
    assert_each_step_once(store, run_id, ["loss"], range(100))


def test_system_sampler_logs_this_node(
    server: RestartableServer, client: Any, tmp_path: Path
) -> None:
    run_id = new_run(client)
    logger = RunLogger(server.url, run_id, tmp_path / "spool.jsonl", flush_interval_s=0.1)
    logger.start()
    sampler = SystemSampler(logger, interval_s=0.4, node="node-a")
    sampler.start()
    keys = ["system/node-a/cpu_percent", "system/node-a/memory_gb"]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.3)
        if all(client.get_metric_history(run_id, key) for key in keys):
            break
    sampler.stop()
    logger.close("FINISHED")
    cpu = client.get_metric_history(run_id, keys[0])
    memory = client.get_metric_history(run_id, keys[1])
    assert cpu and memory
    assert all(0.0 <= m.value <= 100.0 for m in cpu)
    assert all(m.value > 0.0 for m in memory)


def test_system_sampler_reads_the_visible_gpus_through_nvml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No GPU here: a stand-in pynvml with four boards, of which the job sees 3 and 1."""
    calls: list[str] = []

    def handle(index: int) -> dict[str, int]:
        return {"index": index}

    fake = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 4,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetHandleByUUID=lambda uuid: handle(9),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=10 * h["index"]),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=h["index"] * 10**9),
        nvmlDeviceGetPowerUsage=lambda h: 100_000 + h["index"],  # milliwatts
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1,GPU-abc")
    logger = RunLogger("http://127.0.0.1:1", "0" * 32, tmp_path / "spool.jsonl")
    sampler = SystemSampler(logger, interval_s=3600, node="n1")
    sampler.start()
    time.sleep(0.1)  # CPU percent is a difference of /proc/stat readings
    values = sampler.sample()
    sampler.stop()
    assert calls == ["init", "shutdown"]
    gpu = {k.removeprefix("system/n1/"): v for k, v in values.items() if "/gpu" in k}
    assert gpu == {
        "gpu0/utilization": 30.0,
        "gpu0/memory_gb": 3.0,
        "gpu0/power_w": 100.003,
        "gpu1/utilization": 10.0,
        "gpu1/memory_gb": 1.0,
        "gpu1/power_w": 100.001,
        "gpu2/utilization": 90.0,
        "gpu2/memory_gb": 9.0,
        "gpu2/power_w": 100.009,
    }
    assert {"system/n1/cpu_percent", "system/n1/memory_gb"} <= set(values)


LOCKED_START = """
import sys, pathlib
from stoker.tracking.logger import RunLogger
uri, run_id, folder = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
logger = RunLogger(uri, run_id, folder / "spool.jsonl", flush_interval_s=0.1, retry_max_s=1)
logger.start()  # the store is locked: an outage, not an exception
for step in range(5):
    logger.log_metrics({"loss": 1.0 / (step + 1)}, step)
(folder / "started").touch()
logger.close("FINISHED", timeout_s=60)
"""


def test_a_sqlite_store_locked_at_start_is_an_outage_not_a_crash(
    server: RestartableServer, tmp_path: Path
) -> None:
    """A rank frozen while writing holds the sqlite store's lock; the next start's
    ranks open the store while it is held. Seen in CI: they died of "database is
    locked" while making the MLflow client, and the restart failed for good."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    uri = server.db_uri
    run_id = precreate_run(
        resolve_tracking_uri(uri),
        experiment="local",
        run_name="locked",
        params={},
        tags={},
        artifacts={},
    ).run_id
    holder = sqlite3.connect(uri.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # a fresh process cannot even read the schema
    child = subprocess.Popen([sys.executable, "-c", LOCKED_START, uri, run_id, str(tmp_path)],
                             cwd=REPO, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "started").exists() and child.poll() is None:
            assert time.monotonic() < deadline, "start() did not return while the store was locked"
            time.sleep(0.2)
        assert (tmp_path / "started").exists(), child.communicate()[1]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err
    assert "does not answer" in err and "database is locked" in err, err
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert_each_step_once(client, run_id, ["loss"], range(5))


def test_packing_keeps_each_step_once_and_mlflows_limits(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """No store: the step rule and the per-call limits, as the writer packs records."""
    from stoker.tracking.packing import Packer

    packer = Packer("r", batch_points=1000)
    packer.learn({"loss": 4}, {"seed": "1"})
    records = [
        {"run": "r", "m": [["loss", 1.0, 0, step] for step in range(2, 8)]},
        {"run": "r", "p": {"seed": "2", **{f"p{i}": str(i) for i in range(150)}}},
        {"run": "r", "a": ["/tmp/x", None]},
        {"run": "r", "m": [["loss", 9.0, 0, 7]]},  # step 7 again: dropped
    ]
    batches = list(packer.pack(records))
    assert [b.points for b in batches] == [3, 0, 0]  # steps 5, 6, 7 of loss
    assert [len(b.params) for b in batches] == [100, 50, 0]  # 100 params a call
    assert batches[2].artifact == ["/tmp/x", None]
    assert packer.dropped == 3 + 1 and packer.maxes == {"loss": 7}
    assert "param 'seed'" in capfd.readouterr().err


def test_the_spool_skips_cut_lines_and_other_runs(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from stoker.tracking.spool import Spool

    spool = Spool(tmp_path / "spool.jsonl", "r")
    spool.append([{"run": "r", "m": [["loss", 1.0, 0, 1]]}, {"run": "other", "t": {"a": "b"}}])
    with spool.path.open("a") as handle:
        handle.write('{"run": "r", "m": [["lo')  # a write cut short by a kill
    fresh = Spool(spool.path, "r")
    fresh.count()
    assert (spool.points, fresh.points) == (1, 1)
    assert [r["m"] for r in fresh.records()] == [[["loss", 1.0, 0, 1]]]
    err = capfd.readouterr().err
    assert "1 unreadable lines" in err and "other runs (other)" in err
    fresh.clear()
    assert not fresh.has_data() and fresh.points == 0


@pytest.mark.parametrize("visible", [None, "0"])
def test_no_pynvml_is_said_only_where_there_is_a_gpu_to_miss(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    visible: str | None,
) -> None:
    import importlib

    from stoker.tracking import system_metrics

    real_import = importlib.import_module

    def no_pynvml(name: str, *args: Any) -> Any:
        if name == "pynvml":
            raise ImportError(name)
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", no_pynvml)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    gpu_here = system_metrics._has_nvidia_gpu()
    logger = RunLogger("http://127.0.0.1:1", "0" * 32, tmp_path / "spool.jsonl")
    sampler = SystemSampler(logger, interval_s=3600, node="n1")
    sampler.start()
    sampler.stop()
    said = "pynvml (nvidia-ml-py) is not installed" in capsys.readouterr().err
    assert said == gpu_here
    assert gpu_here == (visible is not None or Path("/dev/nvidiactl").exists())
