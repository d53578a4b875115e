"""A run's data sets as MLflow dataset inputs (stoker/tracking/dataset_inputs.py), logged
by RunLogger into a real sqlite store: what an input holds, once per run across a
requeued job's attempts, and kept in the spool through an outage (a server that does
not answer) until the next attempt replays it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stoker.tracking.dataset_inputs import (
    CONTEXT_TAG,
    EVAL,
    NO_MANIFEST,
    TRAINING,
    DataSetInput,
    dataset_entry,
    dataset_source,
)
from stoker.tracking.logger import RunLogger
from tests.mlflow_server import free_port

pytestmark = pytest.mark.usefixtures("mlflow_http_env")

TRAIN = DataSetInput(
    "train",
    TRAINING,
    "s3://bucket/av-train",
    "0123456789abcdef",
    samples=1200,
    duration_s=7200.0,
    shards=12,
    bytes=3_000_000,
    modalities=("video", "audio", "text"),
    bucket_counts={"64x64x2s": 700, "64x96x4s": 500},
)
HELD_OUT = DataSetInput(
    "eval",
    EVAL,
    "/data/av-eval",
    "fedcba9876543210",
    samples=32,
    duration_s=64.0,
    shards=1,
    bytes=9000,
    modalities=("video", "audio"),
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite store for the module: a fresh one's schema takes 5 to 8 s here."""
    return f"sqlite:///{tmp_path_factory.mktemp('lineage-store') / 'mlflow.db'}"


def new_run(client: Any) -> str:
    found = client.get_experiment_by_name("lineage")
    experiment_id = found.experiment_id if found else client.create_experiment("lineage")
    run_id = str(client.create_run(experiment_id).info.run_id)
    client.update_run(run_id, status="SCHEDULED")
    return run_id


def inputs_of(client: Any, run_id: str) -> dict[tuple[str, str], Any]:
    """The run's dataset inputs by (name, context)."""
    found: dict[tuple[str, str], Any] = {}
    for item in client.get_run(run_id).inputs.dataset_inputs:
        context = {t.key: t.value for t in item.tags}[CONTEXT_TAG]
        assert (item.dataset.name, context) not in found, "an input logged twice"
        found[(item.dataset.name, context)] = item.dataset
    return found


def test_an_input_holds_the_manifest_facts_and_lands_once_per_run(
    store: str, tmp_path: Path
) -> None:
    from mlflow.tracking import MlflowClient

    client: Any = MlflowClient(tracking_uri=store)
    run_id = new_run(client)
    spool = tmp_path / "spool.jsonl"
    # Three attempts of a requeued job, each logging its data sets at start.
    for attempt, status in enumerate([None, None, "FINISHED"]):
        logger = RunLogger(store, run_id, spool, flush_interval_s=0.1)
        logger.start()
        logger.log_dataset_inputs([TRAIN, HELD_OUT])
        logger.close(status)  # type: ignore[arg-type]
        assert logger.stats().datasets == (2 if attempt == 0 else 0)

    found = inputs_of(client, run_id)
    assert sorted(found) == [("eval", "eval"), ("train", "training")]
    train = found[("train", "training")]
    assert train.digest == "0123456789abcdef"
    assert (train.source_type, json.loads(train.source)) == ("s3", {"uri": "s3://bucket/av-train"})
    assert json.loads(train.profile) == {
        "samples": 1200, "hours": 2.0, "shards": 12, "bytes": 3_000_000,
        "modalities": "video, audio, text", "bucket 64x64x2s": 700, "bucket 64x96x4s": 500,
    }  # fmt: skip
    assert json.loads(train.schema) == {"mlflow_colspec": [
        {"type": "binary", "name": "video", "required": True},
        {"type": "binary", "name": "audio", "required": True},
        {"type": "string", "name": "text", "required": True},
    ]}  # fmt: skip
    held_out = found[("eval", "eval")]
    assert held_out.source_type == "local"
    assert json.loads(held_out.source) == {"uri": "/data/av-eval"}
    assert json.loads(held_out.profile)["hours"] == pytest.approx(64 / 3600, abs=1e-6)

    # A data set whose manifest changed between attempts is another input: the run read both.
    changed = DataSetInput("train", TRAINING, TRAIN.url, "1111111111111111", samples=1300)
    logger = RunLogger(store, run_id, spool, flush_interval_s=0.1)
    logger.start()
    logger.log_dataset_inputs([changed])
    logger.close("FINISHED")
    digests = sorted(i.dataset.digest for i in client.get_run(run_id).inputs.dataset_inputs)
    assert digests == ["0123456789abcdef", "1111111111111111", "fedcba9876543210"]


def test_inputs_logged_while_the_store_is_down_wait_in_the_spool(
    store: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store)
    run_id = new_run(client)
    spool = tmp_path / "spool.jsonl"
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: every call is refused
    logger = RunLogger(down, run_id, spool, flush_interval_s=0.1, retry_max_s=0.5)
    logger.start()  # a store that does not answer is no error
    logger.log_dataset_inputs([TRAIN, HELD_OUT])
    logger.close(None, timeout_s=1.0)
    kept = [json.loads(line) for line in spool.read_text().splitlines()]
    assert [[e["name"] for e in r["ds"]] for r in kept if "ds" in r] == [["train", "eval"]]
    assert "does not answer" in capfd.readouterr().err

    # The next attempt (the store answers) replays them at start, and logs them again
    # itself: once each.
    logger = RunLogger(store, run_id, spool, flush_interval_s=0.1)
    logger.start()
    logger.log_dataset_inputs([TRAIN, HELD_OUT])
    logger.close("FINISHED")
    assert sorted(inputs_of(client, run_id)) == [("eval", "eval"), ("train", "training")]
    assert logger.stats().datasets == 2 and spool.read_text() == ""


def test_sources_as_the_ui_reads_them() -> None:
    assert dataset_source("s3a://b/k") == ("s3", '{"uri": "s3a://b/k"}')
    assert dataset_source("https://host/set") == ("http", '{"url": "https://host/set"}')
    assert dataset_source("gs://b/set") == ("external", '{"url": "gs://b/set"}')
    assert dataset_source("file:///data/set") == ("local", '{"uri": "/data/set"}')
    kind, source = dataset_source("relative/set")
    assert kind == "local" and json.loads(source)["uri"] == str(Path("relative/set").absolute())
    plain = dataset_entry(DataSetInput("train", TRAINING, "/data/shards-{0..9}.tar", NO_MANIFEST))
    assert plain["digest"] == "no-manifest" and plain["schema"] is None
    assert json.loads(plain["profile"]) == {"manifest": "none: plain WebDataset shards"}


def test_packing_sends_inputs_alone_and_spools_them_whole() -> None:
    from stoker.tracking.packing import Packer

    entry = dataset_entry(TRAIN)
    records: list[dict[str, Any]] = [
        {"run": "r", "m": [["loss", 1.0, 0, 1]]},
        {"run": "r", "ds": [entry]},
        {"run": "r", "t": {"a": "b"}},
    ]
    batches = list(Packer("r", batch_points=1000).pack(records))
    assert [b.points for b in batches] == [1, 0, 0]
    assert batches[1].datasets == [entry] and not batches[1].tags
    assert batches[1].record("r") == {"run": "r", "ds": [entry]}
