"""A job that did not complete gets its time account on its MLflow run from the
launcher (the runtime logs it only at a finished job's end), without mlflow imported:
rows in a sqlite store, a log-batch call to a server; read back with MLflow's client."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.errors import StokerError
from stoker.tracking.ended_run_metrics import log_to_ended_run
from stoker.tracking.runs import precreate_run
from stoker.tracking.store import resolve_tracking_uri


@pytest.mark.parametrize("store", ["sqlite", "server"])
def test_metrics_and_tags_reach_the_run(
    tmp_path: Path, request: pytest.FixtureRequest, store: str
) -> None:
    from mlflow.tracking import MlflowClient

    if store == "sqlite":
        target = resolve_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    else:
        target = resolve_tracking_uri(request.getfixturevalue("mlflow_server").url)
    run_id = precreate_run(target, experiment="ended", run_name="job", params={}, tags={},
                           artifacts={}).run_id  # fmt: skip
    client = MlflowClient(target.uri)
    client.log_metric(run_id, "system/goodput/starts", 1.0, step=40)  # a later step's value
    metrics = {"system/goodput/goodput": 0.62, "system/goodput/starts": 2.0,
               "system/goodput/lost_hang_rank_hours": 0.01}  # fmt: skip
    log_to_ended_run(target, run_id, metrics, {"stoker.goodput": "0.620"}, step=30)
    run = client.get_run(run_id)
    assert run.data.metrics["system/goodput/goodput"] == 0.62
    assert run.data.metrics["system/goodput/lost_hang_rank_hours"] == 0.01
    # The latest value stays the highest step's, as MLflow keeps it.
    assert run.data.metrics["system/goodput/starts"] == 1.0
    history = client.get_metric_history(run_id, "system/goodput/starts")
    assert sorted((m.step, m.value) for m in history) == [(30, 2.0), (40, 1.0)]
    assert run.data.tags["stoker.goodput"] == "0.620"
    with pytest.raises(StokerError, match="no run" if store == "sqlite" else "MLflow server"):
        log_to_ended_run(target, "0" * 32, metrics, {}, step=0)
