"""Checkpoints and final weights as MLflow logged models, each created exactly once.

A committed checkpoint `step-<N>` becomes an external logged model (source run: this
run; params step, uri, bytes; tags `stoker.checkpoint.step`, `stoker.checkpoint.uri`,
`mlflow.model.isExternal`; the `checkpoint/*` metrics as model metrics; a run output
at step N). Nothing of the checkpoint is uploaded: MLflow records where it is, and
the MLmodel file that lets it be registered. The final weights become a logged model
whose artifacts are the files of a folder, uploaded when the writer sends it.

Both go through the queue and the spool like the rest, so a model may be sent twice
(a spool replayed twice, a create the store took as the connection broke): before
creating one, the writer looks for a model of this run with that name and completes
it if it is still PENDING, or skips it if READY.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from stoker.tracking.limits import MAX_PARAM_VALUE, MAX_TAG_VALUE, cut

# The tag MLflow's create_external_model sets (mlflow/utils/mlflow_tags.py).
EXTERNAL_MODEL_TAG = "mlflow.model.isExternal"


def checkpoint_model(step: int, uri: str, size: int, points: list[list[Any]]) -> dict[str, Any]:
    """The "lm" record of checkpoint `step-<step>` at `uri`: an external model whose
    metrics are the run's `points` for it."""
    return {
        "name": f"step-{step}",
        "step": step,
        "params": {"step": str(step), "uri": cut(str(uri), MAX_PARAM_VALUE), "bytes": str(size)},
        "tags": {
            EXTERNAL_MODEL_TAG: "true",
            "stoker.checkpoint.step": str(step),
            "stoker.checkpoint.uri": cut(str(uri), MAX_TAG_VALUE),
        },
        "metrics": points,
        "dir": None,
    }


def folder_model(local_dir: Path, *, step: int, name: str) -> dict[str, Any]:
    """The "lm" record of a model `name` whose artifacts are the files of `local_dir`."""
    return {
        "name": name,
        "step": int(step),
        "params": {"step": str(int(step))},
        "tags": {},
        "metrics": [],
        "dir": str(Path(local_dir).absolute()),
    }


def send_model(client: Any, run_id: str, experiment_id: str | None, model: dict[str, Any]) -> bool:
    """Create the logged model of the record `model`, or complete the one of this run
    with that name that a call cut short left PENDING; False if a READY one was sent
    before. The calls in order: create (PENDING, params, tags), upload (the folder's
    files, or the MLmodel file that makes an external model registrable), model
    metrics, run output, READY. Store errors propagate (the writer decides)."""
    from mlflow.entities import LoggedModelOutput, Metric

    name, local = str(model["name"]), model.get("dir")
    found = _find_model(client, run_id, experiment_id, name)
    if found is not None and str(found.status) == "READY":
        return False
    if found is None:
        found = client.create_logged_model(
            experiment_id=experiment_id,
            name=name,
            source_run_id=run_id,
            tags=model.get("tags") or None,
            params=model.get("params") or None,
        )
        linked = False
    else:
        outputs = getattr(client.get_run(run_id).outputs, "model_outputs", None)
        linked = any(output.model_id == found.model_id for output in outputs or ())
    model_id = found.model_id
    if local is None:
        _upload_external_spec(client, found)
    else:
        client.log_model_artifacts(model_id, str(local))
    if model.get("metrics"):
        # The run's own points again (same key, value, time, step): MLflow keeps one
        # row per run point and adds the model's, as its own log_model does.
        client.log_batch(
            run_id,
            metrics=[
                Metric(k, v, ts, step, model_id=model_id) for k, v, ts, step in model["metrics"]
            ],
            synchronous=True,
        )
    if not linked:
        client.log_outputs(run_id, [LoggedModelOutput(model_id, step=int(model["step"]))])
    client.finalize_logged_model(model_id, "READY")
    return True


def _find_model(client: Any, run_id: str, experiment_id: str | None, name: str) -> Any:
    """This run's logged model `name` (READY first), or None."""
    found = list(
        client.search_logged_models(
            [experiment_id],
            filter_string=f"source_run_id = '{run_id}' AND name = '{name}'",
            max_results=50,
        )
    )
    ready = [m for m in found if str(m.status) == "READY"]
    return (ready or found or [None])[0]


def _upload_external_spec(client: Any, model: Any) -> None:
    """The MLmodel file mlflow.create_external_model writes: it says the artifacts
    live elsewhere, and lets the model be registered in the Model Registry."""
    import tempfile

    from mlflow.models.model import MLMODEL_FILE_NAME
    from mlflow.models.utils import get_external_mlflow_model_spec

    with tempfile.TemporaryDirectory(prefix="stoker-mlmodel-") as folder:
        get_external_mlflow_model_spec(model).save(os.path.join(folder, MLMODEL_FILE_NAME))
        client.log_model_artifacts(model.model_id, folder)
