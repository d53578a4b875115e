"""Runs made at submit (stoker/tracking/runs.py, store.py), against real stores: a
sqlite file in tmp_path and a real `mlflow server` over HTTP, started once per module."""

from __future__ import annotations

import http.server
import shlex
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import StokerError
from stoker.tracking.limits import MAX_PARAM_VALUE
from stoker.tracking.runs import (
    ChildSpec,
    mark_run_failed_to_submit,
    precreate_run,
    precreate_sweep,
)
from stoker.tracking.store import TrackingTarget, resolve_tracking_uri
from tests.mlflow_server import Server, free_port

REPO = Path(__file__).resolve().parents[2]

SBATCH = "#!/bin/bash\n#SBATCH --nodes=2\nsrun python -m stoker.runtime.train\n"
CONFIG = "train:\n  steps: 100\noptim:\n  lr: 0.0003\n"


def mlflow_client(target: TrackingTarget) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=target.uri)


def read_artifact(target: TrackingTarget, run_id: str, name: str, dst: Path) -> str:
    path = mlflow_client(target).download_artifacts(run_id, name, str(dst))
    return Path(path).read_text()


@pytest.fixture(params=["sqlite", "http"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> TrackingTarget:
    if request.param == "sqlite":
        return resolve_tracking_uri(f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}")
    server: Server = request.getfixturevalue("mlflow_server")
    return resolve_tracking_uri(server.url)


def unique(prefix: str) -> str:
    """Experiment names are unique per test: the server is shared by the module."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --- where runs go ----------------------------------------------------------------------


def test_default_store_is_an_absolute_sqlite_file_in_stoker_home(isolated_home: Path) -> None:
    target = resolve_tracking_uri(None)
    folder = isolated_home / ".stoker" / "mlflow"
    assert target == TrackingTarget(
        uri=f"sqlite:///{folder / 'mlflow.db'}",
        artifact_root=str(folder / "artifacts"),
        source="default",
    )
    assert target.uri.startswith("sqlite:////")


def test_env_is_used_when_the_config_has_no_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000/")
    for config_value in (None, "", "  "):
        target = resolve_tracking_uri(config_value)
        assert target.uri == "http://mlflow.example:5000"
        assert target.source == "MLFLOW_TRACKING_URI"
        assert target.artifact_root is None  # the server owns its artifact store


def test_config_uri_wins_over_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    target = resolve_tracking_uri(f"sqlite:///{tmp_path}/team.db")
    assert target.uri == f"sqlite:///{tmp_path}/team.db"
    assert target.artifact_root == str(tmp_path / "artifacts")
    assert target.source == "tracking.uri"


def test_relative_sqlite_path_stays_where_it_was_resolved(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The job runs in another folder: `sqlite:///mlflow.db` must not follow it."""
    (tmp_path / "here").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    target = resolve_tracking_uri("sqlite:///db/mlflow.db?timeout=30")
    assert target.uri == f"sqlite:///{tmp_path}/here/db/mlflow.db?timeout=30"
    assert target.artifact_root == str(tmp_path / "here" / "db" / "artifacts")

    monkeypatch.chdir(tmp_path / "elsewhere")
    run = precreate_run(
        target, experiment="rel", run_name="r", params={}, tags={}, artifacts={"a.txt": "x"}
    )
    assert (tmp_path / "here" / "db" / "mlflow.db").is_file()
    assert run.artifact_uri.startswith(str(tmp_path / "here" / "db" / "artifacts" / "rel"))
    assert list((tmp_path / "elsewhere").iterdir()) == []  # no ./mlruns, no ./mlflow.db


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("file:///srv/mlruns", "file store"),
        ("./mlruns", "file store"),
        ("postgresql://mlflow@db/mlflow", "not supported"),
        ("databricks", "not supported"),
        ("sqlite://", "not a sqlite file"),
        ("sqlite:///:memory:", "not a sqlite file"),
        ("http://", "no host"),
    ],
)
def test_unusable_uris_are_rejected_with_their_source(value: str, says: str) -> None:
    with pytest.raises(StokerError) as caught:
        resolve_tracking_uri(value)
    assert repr(value) in caught.value.message
    assert "tracking.uri" in caught.value.message
    assert says in caught.value.message
    assert caught.value.fix and "tracking.uri" in caught.value.fix


def test_file_store_fix_names_the_migration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "file:///srv/mlruns")
    with pytest.raises(StokerError) as caught:
        resolve_tracking_uri(None)
    assert "MLFLOW_TRACKING_URI" in caught.value.message
    assert caught.value.fix is not None
    assert "mlflow migrate-filestore --source /srv/mlruns" in caught.value.fix
    assert "unset MLFLOW_TRACKING_URI" in caught.value.fix


# --- pre-created runs, on both stores -------------------------------------------------------


def test_precreate_run_records_a_scheduled_run(store: TrackingTarget, tmp_path: Path) -> None:
    experiment = unique("video gen/baseline")
    run = precreate_run(
        store,
        experiment=experiment,
        run_name="baseline-1",
        params={"optim.lr": 3e-4, "train.steps": 100, "model.name": "tiny-av"},
        tags={"team": "video", "stoker.job_name": "baseline"},
        artifacts={"job.sbatch": SBATCH, "config.yaml": CONFIG},
    )
    client = mlflow_client(store)
    exp = client.get_experiment(run.experiment_id)
    assert exp.name == experiment
    if store.is_server:
        assert exp.artifact_location.startswith("mlflow-artifacts:/")
    else:
        folder = experiment.replace(" ", "_").replace("/", "_")
        assert exp.artifact_location == str(Path(str(store.artifact_root)) / folder)

    got = client.get_run(run.run_id)
    assert got.info.status == "SCHEDULED"
    assert got.info.end_time is None
    assert got.info.run_name == "baseline-1"
    assert got.data.params == {"optim.lr": "0.0003", "train.steps": "100", "model.name": "tiny-av"}
    assert got.data.tags["team"] == "video"
    assert got.data.tags["mlflow.runName"] == "baseline-1"
    assert got.data.tags["mlflow.user"]
    assert "mlflow.parentRunId" not in got.data.tags
    assert read_artifact(store, run.run_id, "job.sbatch", tmp_path) == SBATCH
    assert read_artifact(store, run.run_id, "config.yaml", tmp_path) == CONFIG

    assert run.uri == store.uri
    assert f"#/experiments/{run.experiment_id}/runs/{run.run_id}" in run.link
    if store.is_server:
        assert run.link.startswith(store.uri + "/#/")
    else:
        command, url = run.link.split("  # then open ")
        assert shlex.split(command)[:4] == ["mlflow", "ui", "--backend-store-uri", store.uri]
        assert url.startswith("http://127.0.0.1:5000/#/experiments/")

    second = precreate_run(
        store, experiment=experiment, run_name="baseline-2", params={}, tags={}, artifacts={}
    )
    assert second.experiment_id == run.experiment_id
    assert second.run_id != run.run_id


def test_sweep_children_hang_under_their_parent(store: TrackingTarget, tmp_path: Path) -> None:
    experiment = unique("sweep")
    lrs = [1e-4, 3e-4, 1e-3]
    parent, children = precreate_sweep(
        store,
        experiment=experiment,
        parent_name="lr-sweep",
        parent_params={"sweep.size": 3},
        parent_tags={"stoker.sweep": "optim.lr"},
        children=[
            ChildSpec(
                run_name=f"lr-sweep-{i}",
                params={"optim.lr": lr},
                tags={"stoker.job_id": f"77_{i}"},
                artifacts={"config.yaml": f"optim:\n  lr: {lr}\n"},
            )
            for i, lr in enumerate(lrs)
        ],
        parent_artifacts={"job.sbatch": SBATCH},
    )
    client = mlflow_client(store)
    assert client.get_run(parent.run_id).info.status == "SCHEDULED"
    assert client.get_run(parent.run_id).data.params == {"sweep.size": "3"}
    assert read_artifact(store, parent.run_id, "job.sbatch", tmp_path / "p") == SBATCH

    found = client.search_runs(
        [parent.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.run_id}'"
    )
    assert {r.info.run_id for r in found} == {c.run_id for c in children}
    for i, (child, lr) in enumerate(zip(children, lrs, strict=True)):
        got = client.get_run(child.run_id)
        assert got.info.status == "SCHEDULED"
        assert got.data.tags["stoker.sweep.index"] == str(i)
        assert got.data.tags["stoker.job_id"] == f"77_{i}"
        assert got.data.params == {"optim.lr": str(lr)}
        text = read_artifact(store, child.run_id, "config.yaml", tmp_path / str(i))
        assert text == f"optim:\n  lr: {lr}\n"


def test_a_refused_job_leaves_a_failed_run(store: TrackingTarget) -> None:
    run = precreate_run(
        store, experiment=unique("refused"), run_name="r", params={}, tags={}, artifacts={}
    )
    reason = "sbatch: error: Batch job submission failed: Invalid partition name specified"
    mark_run_failed_to_submit(store, run.run_id, reason)
    got = mlflow_client(store).get_run(run.run_id)
    assert got.info.status == "FAILED"
    assert got.info.end_time is not None
    assert got.data.tags["stoker.submit_error"] == reason


# --- limits and bad input ---------------------------------------------------------------------


def test_long_param_values_are_cut_and_many_params_all_land(tmp_path: Path) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    params: dict[str, str | int | float] = {f"p{i:03d}": i for i in range(250)}
    params["data.shards"] = "s3://bucket/shard-" + "x" * 7000
    run = precreate_run(
        target, experiment="limits", run_name="r", params=params, tags={}, artifacts={}
    )
    assert run.truncated_params == ("data.shards",)
    logged = mlflow_client(target).get_run(run.run_id).data.params
    assert len(logged) == 251  # more than MLflow's 100 params per log_batch call
    assert logged["p249"] == "249"
    assert len(logged["data.shards"]) == MAX_PARAM_VALUE
    assert logged["data.shards"].startswith("s3://bucket/shard-xxx")
    assert logged["data.shards"].endswith("[truncated]")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("params", {"lr\n": 1}),
        ("params", {"a/../b": 1}),
        ("tags", {"team!": "x"}),
        ("tags", {"k" * 251: "x"}),
        ("artifacts", {"../escape.txt": "x"}),
    ],
)
def test_bad_names_fail_before_the_store_is_touched(
    tmp_path: Path, field: str, value: dict[str, Any]
) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    kwargs: dict[str, Any] = {"params": {}, "tags": {}, "artifacts": {}}
    kwargs[field] = value
    with pytest.raises(StokerError) as caught:
        precreate_run(target, experiment="e", run_name="r", **kwargs)
    assert repr(next(iter(value)))[:40] in str(caught.value)
    assert not (tmp_path / "mlflow.db").exists()  # nothing created, nothing to clean up


def test_deleted_experiment_says_how_to_restore_it(tmp_path: Path) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    run = precreate_run(target, experiment="old", run_name="r", params={}, tags={}, artifacts={})
    mlflow_client(target).delete_experiment(run.experiment_id)
    with pytest.raises(StokerError) as caught:
        precreate_run(target, experiment="old", run_name="r", params={}, tags={}, artifacts={})
    assert "'old'" in caught.value.message
    assert "deleted" in caught.value.message
    assert caught.value.fix is not None
    assert f"mlflow experiments restore --experiment-id {run.experiment_id}" in caught.value.fix


def test_a_file_that_is_not_a_store_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "mlflow.db"
    db.write_text("these are notes, not a database\n" * 100)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db}")
    target = resolve_tracking_uri(None)
    with pytest.raises(StokerError) as caught:
        precreate_run(target, experiment="e", run_name="r", params={}, tags={}, artifacts={})
    assert f"sqlite:///{db}" in caught.value.message
    assert "MLFLOW_TRACKING_URI" in caught.value.message
    assert "not a database" in caught.value.message
    assert caught.value.fix and "move it away" in caught.value.fix


def test_unreachable_server_fails_fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there any more
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    target = resolve_tracking_uri(None)
    start = time.monotonic()
    with pytest.raises(StokerError) as caught:
        precreate_run(target, experiment="e", run_name="r", params={}, tags={}, artifacts={})
    assert time.monotonic() - start < 5
    assert url in caught.value.message
    assert "MLFLOW_TRACKING_URI" in caught.value.message
    assert "unreachable" in caught.value.message
    assert caught.value.fix and f"curl {url}/health" in caught.value.fix


def test_a_server_that_is_not_mlflow_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    class NotMlflow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404, "no such page")

        do_POST = do_GET

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMlflow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(StokerError) as caught:
            precreate_run(
                resolve_tracking_uri(url),
                experiment="e",
                run_name="r",
                params={},
                tags={},
                artifacts={},
            )
    finally:
        server.shutdown()
        server.server_close()
    assert url in caught.value.message
    assert "tracking.uri" in caught.value.message
    assert "404" in caught.value.message


# --- several submits at once; the sqlite store seen through a server ----------------------------


CONCURRENT_SUBMIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from stoker.tracking.runs import precreate_run
    from stoker.tracking.store import resolve_tracking_uri

    import mlflow.tracking  # paid before the start line, so the processes overlap
    Path(sys.argv[2] + "." + sys.argv[3]).touch()  # ready
    go = Path(sys.argv[2])
    while not go.exists():
        time.sleep(0.01)
    run = precreate_run(
        resolve_tracking_uri(sys.argv[1]), experiment="shared", run_name=sys.argv[3],
        params={"i": sys.argv[3]}, tags={}, artifacts={"job.sbatch": sys.argv[3]},
    )
    print(run.run_id)
    """
)


def test_concurrent_submits_on_a_fresh_sqlite_store(tmp_path: Path) -> None:
    """Without the lock, two of three fail in MLflow's schema migration."""
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT_SUBMIT, uri, str(go), str(i)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{i}").exists() for i in range(3)):
        assert time.monotonic() < deadline, "the submit processes did not start"
        for proc in procs:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    go.touch()
    results = [proc.communicate(timeout=120) for proc in procs]
    for proc, (_, stderr) in zip(procs, results, strict=True):
        assert proc.returncode == 0, stderr[-3000:]
    run_ids = {stdout.strip() for stdout, _ in results}
    target = resolve_tracking_uri(uri)
    client = mlflow_client(target)
    experiment = client.get_experiment_by_name("shared")
    # Created for model training: MLflow's UI opens it in that layout, not the GenAI one.
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    found = client.search_runs([experiment.experiment_id])
    assert {r.info.run_id for r in found} == run_ids
    assert len(run_ids) == 3
    assert {r.data.params["i"] for r in found} == {"0", "1", "2"}


def test_a_sqlite_store_can_be_served_as_its_link_says(mlflow_server: Server) -> None:
    """`mlflow ui --backend-store-uri <sqlite>` shows runs and artifacts written by stoker
    straight into the file (the server here runs on such a file)."""
    target = resolve_tracking_uri(mlflow_server.db_uri)
    assert not target.is_server
    run = precreate_run(
        target,
        experiment=unique("direct"),
        run_name="r",
        params={"optim.lr": 1e-3},
        tags={},
        artifacts={"job.sbatch": SBATCH},
    )
    base = mlflow_server.url
    with urllib.request.urlopen(
        f"{base}/get-artifact?path=job.sbatch&run_uuid={run.run_id}", timeout=10
    ) as response:
        assert response.read().decode() == SBATCH
    served = mlflow_client(resolve_tracking_uri(base)).get_run(run.run_id)
    assert served.info.status == "SCHEDULED"
    assert served.data.params == {"optim.lr": "0.001"}


def test_importing_the_tracking_package_does_not_import_mlflow() -> None:
    """Launcher modules import stoker.tracking on login nodes: every module of it is light."""
    code = (
        "import importlib, pkgutil, sys, stoker.tracking\n"
        "for m in pkgutil.iter_modules(stoker.tracking.__path__):\n"
        "    importlib.import_module('stoker.tracking.' + m.name)\n"
        "heavy = ('mlflow', 'sqlalchemy', 'requests', 'torch')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
