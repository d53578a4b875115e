"""Checkpoint records in MLflow: RunLogger.log_checkpoint and log_final_model against a
real `mlflow server` (stopped and restarted by one test) and its sqlite file opened
directly, as a job on a shared filesystem would. No mocks: the stores are MLflow's own."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import StokerError
from stoker.runtime.observe.rank_tracking import SystemOnly, Tracking
from stoker.tracking.logged_models import EXTERNAL_MODEL_TAG
from stoker.tracking.logger import RunLogger
from stoker.tracking.runs import precreate_run
from stoker.tracking.store import resolve_tracking_uri
from tests.mlflow_server import RestartableServer, free_port

KEYS = [
    "system/checkpoint/bytes",
    "system/checkpoint/blocking_s",
    "system/checkpoint/background_s",
    "system/checkpoint/bytes_per_s",
]


pytestmark = pytest.mark.usefixtures("mlflow_http_env")


@pytest.fixture(params=["sqlite", "server"])
def store_uri(request: pytest.FixtureRequest, server: RestartableServer) -> str:
    """The server's URL, or its sqlite file opened directly (a fresh store's schema takes
    seconds to create; this one exists)."""
    return server.url if request.param == "server" else server.db_uri


def new_run(uri: str) -> str:
    """A SCHEDULED run, as `stoker submit` (or `stoker run`) leaves it."""
    target = resolve_tracking_uri(uri)
    return precreate_run(
        target, experiment="checkpoint-records", run_name="ckpt", params={}, tags={}, artifacts={}
    ).run_id


def client_of(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def models_of(client: Any, run_id: str) -> list[Any]:
    experiment_id = client.get_run(run_id).info.experiment_id
    found = client.search_logged_models([experiment_id], f"source_run_id = '{run_id}'")
    return sorted(found, key=lambda m: m.name)


def history(client: Any, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def checkpoint(logger: Any, step: int) -> None:
    """A checkpoint of step * 1 MB whose background part took step / 10 s."""
    logger.log_checkpoint(
        step,
        f"s3://bucket/run/step-{step}",
        bytes=step * 1_000_000,
        blocking_s=0.25,
        background_s=step / 10,
    )


def expected_points(step: int) -> dict[str, float]:
    return {
        "system/checkpoint/bytes": step * 1e6,
        "system/checkpoint/blocking_s": 0.25,
        "system/checkpoint/background_s": step / 10,
        "system/checkpoint/bytes_per_s": step * 1e6 / (0.25 + step / 10),
    }


def assert_checkpoint_model(client: Any, run_id: str, model: Any, step: int) -> None:
    assert model.name == f"step-{step}"
    assert str(model.status) == "READY"
    assert model.source_run_id == run_id
    assert model.experiment_id == client.get_run(run_id).info.experiment_id
    uri = f"s3://bucket/run/step-{step}"
    assert model.params == {"step": str(step), "uri": uri, "bytes": str(step * 1_000_000)}
    assert model.tags[EXTERNAL_MODEL_TAG] == "true"
    assert model.tags["stoker.checkpoint.step"] == str(step)
    assert model.tags["stoker.checkpoint.uri"] == uri
    # The model metrics: the run's points at that step, once each.
    assert sorted((m.key, m.step, m.value) for m in model.metrics) == sorted(
        (key, step, value) for key, value in expected_points(step).items()
    )
    # Nothing of the checkpoint is uploaded: only the MLmodel file that says so.
    files = [f.path for f in client.list_logged_model_artifacts(model.model_id)]
    assert files == ["MLmodel"]


def test_checkpoint_is_logged_as_metrics_and_an_external_model(
    store_uri: str, tmp_path: Path
) -> None:
    run_id = new_run(store_uri)
    logger = RunLogger(store_uri, run_id, tmp_path / "spool.jsonl", flush_interval_s=0.1)
    logger.start()
    tracking = Tracking(logger, None, run_id)  # what the checkpoint code holds
    started = time.perf_counter()
    checkpoint(tracking, 100)
    enqueue_s = time.perf_counter() - started
    tracking.close("FINISHED")

    client = client_of(store_uri)
    for key, value in expected_points(100).items():
        assert history(client, run_id, key) == [(100, value)], key
    (model,) = models_of(client, run_id)
    assert_checkpoint_model(client, run_id, model, 100)
    outputs = client.get_run(run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(model.model_id, 100)]
    assert logger.stats().models == 1
    # A queue put, not the store's writes (a logged model and its metrics: 100s of ms);
    # room for a busy 2-core machine.
    assert enqueue_s < 0.1, f"log_checkpoint took {enqueue_s * 1e3:.1f} ms"


def test_checkpoints_logged_while_the_server_is_down_are_registered_once(
    server: RestartableServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    run_id = new_run(server.url)
    spool = tmp_path / "spool.jsonl"
    logger = RunLogger(server.url, run_id, spool, flush_interval_s=0.1, retry_max_s=0.5)
    logger.start()
    server.stop()
    try:
        checkpoint(logger, 10)
        checkpoint(logger, 20)
        deadline = time.monotonic() + 30
        while logger.stats().spooled < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert logger.stats().spooled == 8  # 4 points of each, and both models
        assert sum("lm" in json.loads(line) for line in spool.read_text().splitlines()) == 2
    finally:
        server.start()
    logger.close("FINISHED")

    client = client_of(server.url)
    for key in KEYS:
        assert [s for s, _ in history(client, run_id, key)] == [10, 20], key
    models = models_of(client, run_id)
    assert [m.name for m in models] == ["step-10", "step-20"]
    for model, step in zip(models, [10, 20], strict=True):
        assert_checkpoint_model(client, run_id, model, step)
    stats = logger.stats()
    assert (stats.outages, stats.models, spool.read_text()) == (1, 2, "")
    assert client.get_run(run_id).info.status == "FINISHED"
    assert "answers again" in capfd.readouterr().err


def write_weights(folder: Path) -> dict[str, bytes]:
    """A consolidated model as the checkpoint code leaves it: weights and a config."""
    files = {
        "model.safetensors": bytes(range(256)) * 2000,  # 512 kB
        "config.json": b'{"arch": "av_dit", "size": "tiny"}\n',
    }
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return files


def test_final_model_uploads_the_folder(store_uri: str, tmp_path: Path) -> None:
    files = write_weights(tmp_path / "final")
    run_id = new_run(store_uri)
    logger = RunLogger(store_uri, run_id, tmp_path / "spool.jsonl", flush_interval_s=0.1)
    logger.start()
    logger.log_final_model(tmp_path / "final", step=50)
    logger.close("FINISHED")

    from mlflow.artifacts import download_artifacts

    client = client_of(store_uri)
    (model,) = models_of(client, run_id)
    assert (model.name, str(model.status), model.params) == ("final", "READY", {"step": "50"})
    assert EXTERNAL_MODEL_TAG not in model.tags
    got = Path(
        download_artifacts(
            artifact_uri=model.artifact_location,
            dst_path=str(tmp_path / "downloaded"),
            tracking_uri=store_uri,
        )
    )
    assert {p.name: p.read_bytes() for p in got.iterdir()} == files
    outputs = client.get_run(run_id).outputs.model_outputs
    assert [(o.model_id, o.step) for o in outputs] == [(model.model_id, 50)]


def test_a_spool_replayed_twice_registers_each_model_once(
    server: RestartableServer, tmp_path: Path
) -> None:
    uri = server.db_uri
    client = client_of(uri)
    files = write_weights(tmp_path / "final")
    run_id = new_run(uri)
    spool = tmp_path / "spool.jsonl"
    # Attempt 1's store does not answer: both records end in the spool.
    down_url = f"http://127.0.0.1:{free_port()}"
    first = RunLogger(down_url, run_id, spool, flush_interval_s=0.1, retry_max_s=0.2)
    first.start()
    checkpoint(first, 30)
    first.log_final_model(tmp_path / "final", step=30)
    first.close(None, timeout_s=0.5)
    lines = spool.read_text()
    assert sum("lm" in json.loads(line) for line in lines.splitlines()) == 2
    # A create the store took as the connection broke: step-30 exists, still PENDING.
    experiment_id = client.get_run(run_id).info.experiment_id
    pending = client.create_logged_model(experiment_id, name="step-30", source_run_id=run_id)

    second = RunLogger(uri, run_id, spool, flush_interval_s=0.1)
    second.start()  # replays the spool
    assert spool.read_text() == ""
    second.close(None)
    # The same lines again: a job killed after the store took them, before the truncate.
    spool.write_text(lines)
    third = RunLogger(uri, run_id, spool, flush_interval_s=0.1)
    third.start()
    third.close("FINISHED")

    assert (second.stats().models, third.stats().models) == (2, 0)
    final, step_30 = models_of(client, run_id)
    assert step_30.model_id == pending.model_id  # completed, not created again
    assert str(step_30.status) == "READY"
    assert step_30.metrics and len(step_30.metrics) == 4
    for key, value in expected_points(30).items():
        assert history(client, run_id, key) == [(30, value)], key
    assert (final.name, str(final.status)) == ("final", "READY")
    got = [f.path for f in client.list_logged_model_artifacts(final.model_id)]
    assert sorted(got) == sorted(files)
    outputs = client.get_run(run_id).outputs.model_outputs
    assert sorted((o.model_id, o.step) for o in outputs) == sorted(
        [(final.model_id, 30), (step_30.model_id, 30)]
    )


def test_final_model_of_a_removed_folder_is_dropped_with_a_warning(
    server: RestartableServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    uri = server.db_uri
    run_id = new_run(uri)
    logger = RunLogger(uri, run_id, tmp_path / "spool.jsonl", flush_interval_s=0.1)
    logger.start()
    logger.log_final_model(tmp_path / "gone", step=5)
    logger.close("FINISHED")
    assert models_of(client_of(uri), run_id) == []
    err = capfd.readouterr().err
    assert "refused logged model 'final'" in err and "no longer exists" in err, err


def test_old_spool_records_and_unknown_kinds_are_replayed_as_before(
    server: RestartableServer, tmp_path: Path
) -> None:
    uri = server.db_uri
    run_id = new_run(uri)
    spool = tmp_path / "spool.jsonl"
    stamp = int(time.time() * 1000)
    records = [
        {"run": run_id, "m": [["loss", 2.0, stamp, 1]], "p": {"seed": "1"}},
        {"run": run_id, "zz": {"a later version's": "kind"}},
        {"run": run_id, "m": [["loss", 1.5, stamp, 2]], "t": {"stoker.attempt": "1"}},
    ]
    spool.write_text("".join(json.dumps(r) + "\n" for r in records))
    logger = RunLogger(uri, run_id, spool, flush_interval_s=0.1)
    logger.start()
    logger.close("FINISHED")
    client = client_of(uri)
    assert history(client, run_id, "loss") == [(1, 2.0), (2, 1.5)]
    run = client.get_run(run_id)
    assert (run.data.params, run.data.tags["stoker.attempt"]) == ({"seed": "1"}, "1")
    assert spool.read_text() == "" and models_of(client, run_id) == []


def test_model_names_and_other_nodes(tmp_path: Path) -> None:
    logger = RunLogger("http://127.0.0.1:1", "0" * 32, tmp_path / "spool.jsonl")
    with pytest.raises(StokerError, match="not a name MLflow takes"):
        logger.log_final_model(tmp_path, step=1, name="final/v1")
    # Other nodes' local rank 0 and ranks without a logger record nothing.
    for tracking in (Tracking(SystemOnly(logger), None, "x"), Tracking(None, None, None)):
        checkpoint(tracking, 10)
        tracking.log_final_model(tmp_path, step=10)
    logger.close(None)  # never started: would spool what was logged
    assert not (tmp_path / "spool.jsonl").exists()


def test_the_rank_sinks_offer_what_the_trainer_calls() -> None:
    """Tracking (every rank's sink) and SystemOnly (other nodes') answer each call of
    MetricsSink with its signature, as RunLogger does (tests/runtime/test_trainer.py)."""
    import inspect

    from stoker.runtime.observe.metrics_sink import MetricsSink

    names = [n for n, v in vars(MetricsSink).items() if inspect.isfunction(v) and n[0] != "_"]
    assert names
    for name in names:
        declared = inspect.signature(getattr(MetricsSink, name))
        for sink in (Tracking, SystemOnly):
            assert inspect.signature(getattr(sink, name)) == declared, (sink, name)
