"""Versions in MLflow's model registry for exported weights, with their lineage as tags.

`stoker ckpt export CKPT OUT --register NAME` (and the trainer, for its final weights)
calls `register_version`: the weights are uploaded as a logged model of the run that
saved the checkpoint, and that logged model becomes the next version of registered
model NAME. MLflow 3's registry versions point at a logged model (`models:/<model_id>`):
its page links the source run, and `models:/NAME/<version>` downloads the files.

The version's tags say where it came from, so that a deployed model can be traced back
to its training run, its exact checkpoint, its data and what it sounded like:

    stoker.run_id                     the run that saved the checkpoint
    stoker.checkpoint.uri, .step      the step-<N> folder
    stoker.checkpoint.commit_sha256   sha256 of its COMMIT.json (which holds every
                                      file's sha256: one digest pins the checkpoint)
    stoker.dataset.<name>             the digest of each data set the run read (its
                                      MLflow dataset inputs, stoker/tracking/dataset_inputs.py)
    stoker.samples                    runs:/<run_id>/samples/step-<N>: the clips
                                      sampled at that step
    stoker.lineage.missing            what could not be found: run, commit, datasets,
                                      samples (absent when nothing is missing)
    stoker.weights                    "ema" or "model" (`stoker ckpt export --ema`)

A checkpoint that names no run is registered all the same, its model in the experiment
`stoker-registry`, with `stoker.lineage.missing` saying so.

No mlflow import at module level (login nodes import the tracking package).
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.errors import StokerError
from stoker.tracking.limits import MAX_KEY_LENGTH, MAX_TAG_VALUE, check_registered_model_name, cut
from stoker.tracking.store import open_store, resolve_tracking_uri, store_errors

REGISTRY_EXPERIMENT = "stoker-registry"
"""Where the logged model of weights without a source run goes."""
RUN_TAG = "stoker.run_id"
STEP_TAG = "stoker.checkpoint.step"
URI_TAG = "stoker.checkpoint.uri"
COMMIT_TAG = "stoker.checkpoint.commit_sha256"
DATASET_TAG_PREFIX = "stoker.dataset."
SAMPLES_TAG = "stoker.samples"
WEIGHTS_TAG = "stoker.weights"
MISSING_TAG = "stoker.lineage.missing"


@dataclass(frozen=True)
class RegisteredVersion:
    name: str
    version: int
    run_id: str | None
    """The run that saved the checkpoint (the version's source run); None if unknown."""
    model_id: str
    """The logged model holding the weights: the version's source is models:/<model_id>."""
    tags: dict[str, str] = field(default_factory=dict)
    """The lineage tags set on the version."""
    missing: tuple[str, ...] = ()
    """Lineage that was not found: "run", "commit", "datasets", "samples"."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def register_version(
    name: str,
    weights: str | Path,
    *,
    checkpoint_url: str,
    step: int,
    run_id: str | None,
    commit_sha256: str | None,
    tracking_uri: str | None = None,
    extra_tags: Mapping[str, str] | None = None,
) -> RegisteredVersion:
    """Upload `weights` (a local file or folder, or a file's fsspec URL) and register
    them as the next version of registered model `name` (created if absent), with the
    lineage tags above.

    `checkpoint_url`, `step`: the `step-<N>` folder the weights were exported from.
    `run_id`: the run that saved it (the train state's `mlflow_run_id`); None registers
    without a run. `commit_sha256`: sha256 of its COMMIT.json
    (`stoker.checkpoint.origin.commit_sha256`). `tracking_uri`: as `tracking.uri`
    (None: $MLFLOW_TRACKING_URI, else stoker's own store). `extra_tags`: more tags for
    the version and its logged model, e.g. {"stoker.weights": "ema"}.

    Raises StokerError for a name the registry refuses, missing weights, a run the store
    does not hold, and a store that cannot be reached or refuses a call. Blocking: one
    upload of the weights, then a few calls.
    """
    check_registered_model_name(name)
    target = resolve_tracking_uri(tracking_uri)
    with (
        _local_weights(weights) as local,
        open_store(target, None if run_id else REGISTRY_EXPERIMENT) as (client, experiment_id),
        store_errors(target, f"register model {name!r}"),
    ):
        run = _run(client, run_id, target.describe()) if run_id else None
        if run is not None:
            experiment_id = run.info.experiment_id
        tags, missing = _lineage_tags(
            client, run, step=step, checkpoint_url=checkpoint_url, commit=commit_sha256
        )
        tags.update(extra_tags or {})
        # A caller that knows the samples are on their way (the trainer: its upload
        # queue may not have sent them yet) names them itself.
        missing = tuple(m for m in missing if not (m == "samples" and SAMPLES_TAG in tags))
        tags.pop(MISSING_TAG, None)
        if missing:
            tags[MISSING_TAG] = ", ".join(missing)
        model_id = _upload(client, experiment_id, name, local, step, run_id, tags)
        _ensure_registered_model(client, name)
        with _global_tracking_uri(target.uri):
            version = client.create_model_version(
                name, source=f"models:/{model_id}", run_id=run_id, tags=tags, model_id=model_id
            )
    return RegisteredVersion(
        name=name,
        version=int(version.version),
        run_id=run_id,
        model_id=model_id,
        tags=tags,
        missing=missing,
    )


def _run(client: Any, run_id: str, store: str) -> Any:
    """The run, or a StokerError that points at the store: a run id the store does not
    know almost always means another store than the job's."""
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
    raise StokerError(
        f"the checkpoint names MLflow run {run_id!r}, which is not in the store {store}",
        fix="pass --tracking-uri (or set MLFLOW_TRACKING_URI) to the store the job recorded "
        "into: `stoker status` shows each job's run link",
    )


def _lineage_tags(
    client: Any, run: Any, *, step: int, checkpoint_url: str, commit: str | None
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The version's tags, and which lineage was not found (`run`: the MLflow run, or None)."""
    run_id = str(run.info.run_id) if run is not None else None
    tags = {STEP_TAG: str(int(step)), URI_TAG: cut(checkpoint_url, MAX_TAG_VALUE)}
    missing: list[str] = []
    if run_id:
        tags[RUN_TAG] = run_id
    else:
        missing.append("run")
    if commit:
        tags[COMMIT_TAG] = commit
    else:
        missing.append("commit")
    datasets = dataset_digests(run) if run is not None else {}
    for key, digests in datasets.items():
        tags[key] = cut(", ".join(digests), MAX_TAG_VALUE)
    if not datasets:
        missing.append("datasets")
    samples = f"samples/step-{int(step)}"
    if run_id and client.list_artifacts(run_id, samples):
        tags[SAMPLES_TAG] = f"runs:/{run_id}/{samples}"
    else:
        missing.append("samples")
    if missing:
        tags[MISSING_TAG] = ", ".join(missing)
    return tags, tuple(missing)


def dataset_digests(run: Any) -> dict[str, list[str]]:
    """Tag key -> the digests of the MLflow run's dataset inputs by that name (a data set
    that changed between a job's attempts was logged with each digest: the run read both)."""
    inputs = run.inputs  # None from a store that records no inputs
    found: dict[str, list[str]] = {}
    for item in inputs.dataset_inputs if inputs else ():
        key = dataset_tag(item.dataset.name)
        if item.dataset.digest not in found.setdefault(key, []):
            found[key].append(item.dataset.digest)
    return found


def dataset_tag(dataset_name: str) -> str:
    """The tag key of a data set's digest: `stoker.dataset.<name>`, the name cut down to
    the characters and length MLflow takes in a key."""
    safe = re.sub(r"[^\w.\- ]", "_", dataset_name).strip(". ") or "unnamed"
    return DATASET_TAG_PREFIX + safe[: MAX_KEY_LENGTH - len(DATASET_TAG_PREFIX)]


def _upload(
    client: Any,
    experiment_id: str,
    name: str,
    local: Path,
    step: int,
    run_id: str | None,
    tags: dict[str, str],
) -> str:
    """A READY logged model holding the weights' files; its id. Listed among the run's
    outputs at `step`, so the run page shows what was registered from it."""
    from mlflow.entities import LoggedModelOutput

    # A logged model's name takes none of / : . % and quotes; a registered one may.
    model_name = re.sub(r"[/:.%\"']", "-", name) + f"-step-{int(step)}"
    model = client.create_logged_model(
        experiment_id=experiment_id,
        name=model_name,
        source_run_id=run_id,
        tags=tags,
        params={"step": str(int(step)), "registered_model": name},
    )
    try:
        if local.is_dir():
            client.log_model_artifacts(model.model_id, str(local))
        else:
            client.log_model_artifact(model.model_id, str(local))
        if run_id:
            client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=int(step))])
    except BaseException:
        # A half-uploaded model must not look usable in the UI.
        with contextlib.suppress(Exception):  # the first error is the one to report
            client.finalize_logged_model(model.model_id, "FAILED")
        raise
    client.finalize_logged_model(model.model_id, "READY")
    return str(model.model_id)


@contextlib.contextmanager
def _global_tracking_uri(uri: str) -> Iterator[None]:
    """MLflow's global tracking URI set to `uri` for one call, then put back as it was.

    A database store's registry resolves a version's `models:/<model_id>` source
    through MLflow's global tracking URI, not through the client's own (MLflow's TODO in
    SqlAlchemyStore.create_model_version). stoker never sets the global one, so there it
    is MLflow's default, sqlite:///mlflow.db in the current folder: the logged model is
    "not found", and a stray mlflow.db is left behind. A server resolves it in its own
    store; setting the global URI changes nothing there. Set directly, not through
    `mlflow.set_tracking_uri`, which also writes MLFLOW_TRACKING_URI into the
    environment and, when put back to unset, would delete a value the user had there.
    """
    from mlflow.tracking._tracking_service import utils

    before = utils._tracking_uri
    utils._tracking_uri = uri  # type: ignore[assignment]  # typed None in MLflow
    try:
        yield
    finally:
        utils._tracking_uri = before


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.create_registered_model(name)
    except MlflowException as exc:
        # Already there (registered before, or by another process just now): add to it.
        if exc.error_code != "RESOURCE_ALREADY_EXISTS":
            raise


@contextlib.contextmanager
def _local_weights(weights: str | Path) -> Iterator[Path]:
    """`weights` as a local path: itself, or a URL's file downloaded into a temp folder
    for the time of the upload (MLflow uploads from local files)."""
    text = str(weights)
    if "://" not in text or text.startswith("file://"):
        local = Path(text.removeprefix("file://"))
        if not local.exists():
            raise StokerError(
                f"cannot register {text!r}: no such file or folder",
                fix="export the weights first (`stoker ckpt export CKPT OUT`), then name OUT",
            )
        yield local
        return
    from fsspec.core import url_to_fs

    fs, path = url_to_fs(text)
    if not fs.isfile(path):
        raise StokerError(
            f"cannot register {text!r}: no such file",
            fix="name the exported weights file (a folder is registered from a local path)",
        )
    with tempfile.TemporaryDirectory(prefix="stoker-register-") as folder:
        local = Path(folder) / path.rstrip("/").rsplit("/", 1)[-1]
        fs.get_file(path, str(local))
        yield local
