"""Runs `stoker submit` writes into a sqlite store with sqlite3 (stoker/tracking/
direct_runs.py), read back through MLflow's own client: the same run as one MLflow
made, and no mlflow import in the submitting process. Stores that direct_runs cannot
write go through MLflow."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stoker.errors import StokerError
from stoker.tracking.direct_runs import KNOWN_REVISIONS, open_direct
from stoker.tracking.runs import (
    ChildSpec,
    CreatedRun,
    mark_run_failed_to_submit,
    precreate_run,
    precreate_sweep,
    update_submitted_runs,
)
from stoker.tracking.store import TrackingTarget, resolve_tracking_uri

REPO = Path(__file__).resolve().parents[2]
SBATCH = "#!/bin/bash\n#SBATCH --nodes=2\nsrun python -m stoker.runtime.train\n"


def _client(target: TrackingTarget) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=target.uri)


def _run(target: TrackingTarget, name: str, experiment: str = "exp") -> CreatedRun:
    return precreate_run(
        target, experiment=experiment, run_name=name,
        params={"optim.lr": 3e-4, "train.steps": 100}, tags={"team": "video"},
        artifacts={"job.sbatch": SBATCH, "code/manifest.txt": "a.py\n"},
    )  # fmt: skip


def test_the_known_revisions_hold_the_installed_mlflows_schema() -> None:
    """When MLflow's schema moves on, direct_runs' columns must be checked against it."""
    from mlflow.store.db.utils import _get_latest_schema_revision

    assert _get_latest_schema_revision() in KNOWN_REVISIONS  # type: ignore[no-untyped-call]


def test_a_run_written_directly_reads_back_as_one_mlflow_made(tmp_path: Path) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert open_direct(target, "exp") is None  # no store yet: MLflow creates it
    by_mlflow = _run(target, "first")
    assert open_direct(target, "exp") is not None
    direct = _run(target, "second")
    client = _client(target)
    made, written = client.get_run(by_mlflow.run_id), client.get_run(direct.run_id)
    assert written.info.run_name == "second" and made.info.run_name == "first"
    for field in ("status", "user_id", "lifecycle_stage", "experiment_id", "end_time"):
        assert getattr(written.info, field) == getattr(made.info, field), field
    assert written.info.status == "SCHEDULED" and written.info.start_time > 0
    assert written.info.artifact_uri == made.info.artifact_uri.replace(
        by_mlflow.run_id, direct.run_id
    )
    assert direct.artifact_uri == written.info.artifact_uri
    assert written.data.params == made.data.params == {"optim.lr": "0.0003", "train.steps": "100"}
    renamed = {**made.data.tags, "mlflow.runName": "second"}
    assert written.data.tags == renamed
    listed = sorted(a.path for a in client.list_artifacts(direct.run_id))
    assert listed == sorted(a.path for a in client.list_artifacts(by_mlflow.run_id))
    text = client.download_artifacts(direct.run_id, "job.sbatch", str(tmp_path / "dl"))
    assert Path(text).read_text() == SBATCH
    assert written.data.tags["mlflow.runName"] == "second"
    found = client.search_runs([made.info.experiment_id], "tags.team = 'video'")
    assert {r.info.run_id for r in found} == {by_mlflow.run_id, direct.run_id}

    # What follows sbatch's answer, and a refusal.
    update_submitted_runs(
        target, {direct.run_id: ({"job.sbatch": SBATCH + "#"}, {"slurm.job_id": "7"})}
    )
    mark_run_failed_to_submit(target, direct.run_id, "sbatch: error: invalid partition")
    ended = client.get_run(direct.run_id)
    assert ended.info.status == "FAILED" and ended.info.end_time >= ended.info.start_time
    assert ended.data.tags["slurm.job_id"] == "7"
    assert ended.data.tags["stoker.submit_error"] == "sbatch: error: invalid partition"
    again = client.download_artifacts(direct.run_id, "job.sbatch", str(tmp_path / "dl2"))
    assert Path(again).read_text() == SBATCH + "#"

    # A new experiment in the store, as MLflow made the first one.
    other = _run(target, "third", experiment="video gen/v2")
    first, second = (
        client.get_experiment(made.info.experiment_id),
        client.get_experiment(other.experiment_id),
    )
    assert second.name == "video gen/v2" and second.lifecycle_stage == first.lifecycle_stage
    assert second.tags == first.tags == {"mlflow.experimentKind": "custom_model_development"}
    assert second.artifact_location == str(tmp_path / "artifacts" / "video_gen_v2")
    assert Path(first.artifact_location).parent == Path(second.artifact_location).parent
    assert client.get_experiment_by_name("video gen/v2").experiment_id == other.experiment_id
    assert client.get_run(other.run_id).info.artifact_uri.startswith(second.artifact_location)

    # A sweep into the experiment: children under their parent in MLflow's search.
    parent, children = precreate_sweep(
        target, experiment="exp", parent_name="sweep", parent_params={"sweep.size": 2},
        parent_tags={}, children=[ChildSpec(run_name=f"sweep-{i}", params={"i": i})
                                  for i in range(2)],
    )  # fmt: skip
    nested = client.search_runs(
        [parent.experiment_id], f"tags.mlflow.parentRunId = '{parent.run_id}'"
    )
    assert sorted(r.data.params["i"] for r in nested) == ["0", "1"]
    assert {r.data.tags["stoker.sweep.index"] for r in nested} == {"0", "1"}
    assert {r.info.run_id for r in nested} == {c.run_id for c in children}


PRECREATE = """
import sys
from stoker.tracking.runs import mark_run_failed_to_submit, precreate_run, update_submitted_runs
from stoker.tracking.store import resolve_tracking_uri
target = resolve_tracking_uri(sys.argv[1])
run = precreate_run(target, experiment="exp", run_name="r", params={"a": 1}, tags={},
                    artifacts={"config.yaml": "a: 1\\n"})
update_submitted_runs(target, {run.run_id: ({}, {"slurm.job_id": "8"})})
mark_run_failed_to_submit(target, run.run_id, "refused")
heavy = ("mlflow", "sqlalchemy", "alembic")
print(run.run_id, sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in heavy}))
"""


def test_a_submit_into_a_store_that_exists_imports_no_mlflow(tmp_path: Path) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _run(target, "first")  # the store and the experiment, made by MLflow
    result = subprocess.run(
        [sys.executable, "-c", PRECREATE, target.uri],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    run_id, imported = result.stdout.strip().split(" ", 1)
    assert imported == "[]"
    got = _client(target).get_run(run_id)
    assert got.info.status == "FAILED" and got.data.tags["slurm.job_id"] == "8"


def test_a_run_whose_artifacts_cannot_be_written_is_left_failed(tmp_path: Path) -> None:
    """The run is made in one transaction, its files after: a failure there leaves the
    run FAILED with the reason, not SCHEDULED for a job that never comes."""
    target = resolve_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _run(target, "first")
    (tmp_path / "artifacts" / "blocked").write_text("a file where the folder would be")
    with pytest.raises(StokerError, match="create a run in experiment 'blocked'"):
        _run(target, "r", experiment="blocked")
    client = _client(target)
    (run,) = client.search_runs([client.get_experiment_by_name("blocked").experiment_id])
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert "stoker submit failed while creating the run" in run.data.tags["stoker.submit_error"]


def test_stores_direct_runs_cannot_write_go_through_mlflow(tmp_path: Path) -> None:
    target = resolve_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    _run(target, "first")
    client = _client(target)
    assert open_direct(target, "exp") is not None
    # An experiment whose artifacts are not a local folder, and a deleted one.
    client.create_experiment("remote", artifact_location="s3://bucket/runs")
    assert open_direct(target, "remote") is None
    gone = client.create_experiment("gone")
    client.delete_experiment(gone)
    assert open_direct(target, "gone") is None
    # A store of another MLflow version (another schema revision).
    other = tmp_path / "other" / "mlflow.db"
    other.parent.mkdir()
    shutil.copy(tmp_path / "mlflow.db", other)
    with sqlite3.connect(other) as conn:
        conn.execute("UPDATE alembic_version SET version_num = 'a1b2c3d4e5f6'")
    assert open_direct(resolve_tracking_uri(f"sqlite:///{other}"), "exp") is None
    assert open_direct(resolve_tracking_uri("http://mlflow.example:5000"), "exp") is None
    # Through MLflow, a run in the remote experiment is made as before.
    run = precreate_run(target, experiment="remote", run_name="r", params={}, tags={},
                        artifacts={})  # fmt: skip
    assert client.get_run(run.run_id).info.artifact_uri.startswith("s3://bucket/runs/")
