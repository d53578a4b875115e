"""A job's MLflow run ends in the job's state, once, whoever sees the end first
(stoker/tracking/run_end.py), and the ledger keeps what was done (launcher/watch/job_end.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from stoker.launcher.jobs.ledger import JobRecord, Ledger
from stoker.launcher.jobs.targets import Target
from stoker.launcher.watch.job_end import Ended, end_mlflow_runs, short_reason
from stoker.tracking.run_end import main, reopen_run, run_status_of
from stoker.tracking.runs import precreate_run
from stoker.tracking.store import TrackingTarget, resolve_tracking_uri
from tests.mlflow_server import free_port


def _store(tmp_path: Path) -> TrackingTarget:
    return resolve_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")


def _run(target: TrackingTarget, name: str = "job") -> str:
    return precreate_run(
        target, experiment="ends", run_name=name, params={}, tags={}, artifacts={}
    ).run_id


def _status(target: TrackingTarget, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return str(MlflowClient(target.uri).get_run(run_id).info.status)


@pytest.mark.parametrize(
    ("state", "status"),
    [
        ("COMPLETED", "FINISHED"),
        ("FAILED", "FAILED"),
        ("CANCELLED by 1000", "KILLED"),
        ("PREEMPTED", "KILLED"),
        ("TIMEOUT", "FAILED"),
        ("OUT_OF_MEMORY", "FAILED"),
        ("NODE_FAIL", "FAILED"),
    ],
)
def test_run_status_of_each_end_state(state: str, status: str) -> None:
    assert run_status_of(state) == status


@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_the_first_to_see_the_end_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture, request: pytest.FixtureRequest, store: str
) -> None:
    if store == "sqlite":
        target = _store(tmp_path)
    else:  # through the REST API of a real `mlflow server`
        target = resolve_tracking_uri(request.getfixturevalue("mlflow_server").url)
    run_id = _run(target)
    assert _status(target, run_id) == "SCHEDULED"
    mark = tmp_path / "mlflow-run-ended"
    assert main([target.uri, run_id, "FAILED", str(mark)]) == 0
    assert _status(target, run_id) == "FAILED" and mark.exists()
    assert f"MLflow run {run_id} ended FAILED" in capsys.readouterr().err
    # Later observers (status after the batch script) change nothing.
    assert main([target.uri, run_id, "COMPLETED"]) == 0
    assert _status(target, run_id) == "FAILED"
    assert "ended" not in capsys.readouterr().err
    # `stoker requeue`: the job runs again in its run, which then ends as the job ends.
    assert reopen_run(target, run_id) and _status(target, run_id) == "RUNNING"
    assert not reopen_run(target, run_id)  # open already
    assert main([target.uri, run_id, "COMPLETED"]) == 0
    assert _status(target, run_id) == "FINISHED"


def test_a_store_that_cannot_be_reached_never_fails_the_job() -> None:
    port = free_port()
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "stoker.tracking.run_end", f"http://127.0.0.1:{port}",
         "0123456789abcdef0123456789abcdef", "FAILED"],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "could not end MLflow run 0123456789abcdef0123456789abcdef" in result.stderr
    assert time.monotonic() - start < 120


def _record(job_id: str, target: TrackingTarget, run_id: str, **fields: object) -> JobRecord:
    return JobRecord(
        job_id=job_id, backend="slurm", cluster="c", name="j", run_dir="/nonexistent",
        config_digest="0" * 16, template="default", mlflow_run_id=run_id,
        tracking_uri=target.uri, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def test_status_ends_open_runs_once_and_an_arrays_parent_when_all_tasks_ended(
    tmp_path: Path,
) -> None:
    target = _store(tmp_path)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    single = _record("10", target, _run(target))
    children = [_run(target, f"task {i}") for i in range(2)]
    array = _record(
        "11", target, _run(target, "sweep"), array_size=2, extra={"child_run_ids": children}
    )
    for record in (single, array):
        ledger.add(record)
    # One task still running: the children that ended end, the parent stays open.
    end_mlflow_runs(
        ledger, [Ended(Target(single), "TIMEOUT"), Ended(Target(array, 0), "COMPLETED")]
    )
    assert _status(target, str(single.mlflow_run_id)) == "FAILED"
    assert _status(target, children[0]) == "FINISHED"
    assert _status(target, str(array.mlflow_run_id)) == "SCHEDULED"
    kept = ledger.require("10").extra["mlflow_ended"]
    assert kept == {single.mlflow_run_id: True}
    array = ledger.require("11")
    end_mlflow_runs(
        ledger, [Ended(Target(array, 0), "COMPLETED"), Ended(Target(array, 1), "FAILED")]
    )
    assert _status(target, children[1]) == "FAILED"
    assert _status(target, str(array.mlflow_run_id)) == "FAILED"  # one task failed


def test_a_store_down_is_tried_again_only_after_a_while(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    down = resolve_tracking_uri(f"http://127.0.0.1:{free_port()}")
    ledger = Ledger(tmp_path / "ledger.sqlite")
    ledger.add(_record("12", down, "0" * 32))
    end_mlflow_runs(ledger, [Ended(Target(ledger.require("12")), "FAILED")], now=1000.0)
    assert "could not end the MLflow run of job 12" in capsys.readouterr().err
    assert ledger.require("12").extra["mlflow_end_tried"] == 1000.0
    end_mlflow_runs(ledger, [Ended(Target(ledger.require("12")), "FAILED")], now=1100.0)
    assert capsys.readouterr().err == ""  # not tried again so soon


def test_short_reason() -> None:
    assert short_reason("rank 1: short") == "rank 1: short"
    cut = short_reason("rank 1: " + "x" * 200)
    assert len(cut) == 72 and cut.endswith("…")
    assert short_reason("first line\nsecond") == "first line"


def test_a_run_the_job_ended_itself_costs_status_no_store_call(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The batch script left `mlflow-run-ended` in the run folder: status notes the run
    as ended without asking the store (here one that cannot be reached)."""
    down = resolve_tracking_uri(f"http://127.0.0.1:{free_port()}")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "mlflow-run-ended").touch()
    ledger = Ledger(tmp_path / "ledger.sqlite")
    record = _record("13", down, "1" * 32)
    record.run_dir = str(run_dir)
    ledger.add(record)
    end_mlflow_runs(ledger, [Ended(Target(ledger.require("13")), "COMPLETED")])
    assert capsys.readouterr().err == ""
    assert ledger.require("13").extra["mlflow_ended"] == {"1" * 32: True}
