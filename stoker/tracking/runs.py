"""The runs stoker creates: the one a job logs into, and a sweep's parent and children.

`stoker submit` creates the MLflow run before the job is queued, so the user gets a
link at once and the job only logs into an existing run (`MLFLOW_RUN_ID`). A job
started without one (torchrun by hand) creates its run with the same `precreate_run`
(stoker/runtime/observe/rank_tracking.py). Runs are created SCHEDULED; the job's RunLogger
marks them RUNNING. Every name is checked before the first run is created, and a
failure half-way marks the runs already made FAILED.
"""

from __future__ import annotations

import getpass
import posixpath
import shlex
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stoker.errors import StokerError
from stoker.redact import REDACTED, hide_url_passwords, is_secret_name
from stoker.sqlite_retry import is_locked_error
from stoker.tracking.direct_runs import open_direct
from stoker.tracking.limits import (
    MAX_EXPERIMENT_NAME,
    MAX_PARAM_VALUE,
    MAX_TAG_VALUE,
    PARAMS_PER_BATCH,
    ParamValue,
    check_key,
    cut,
)
from stoker.tracking.store import RetryingClient, TrackingTarget, open_store, store_errors

if TYPE_CHECKING:
    from stoker.config import ResolvedConfig

# Tags stoker sets on the runs it creates.
TAG_PARENT = "mlflow.parentRunId"
TAG_USER = "mlflow.user"
TAG_SWEEP_INDEX = "stoker.sweep.index"
TAG_SUBMIT_ERROR = "stoker.submit_error"


@dataclass(frozen=True)
class CreatedRun:
    """A run made by `precreate_run` / `precreate_sweep`, in status SCHEDULED."""

    run_id: str
    experiment_id: str
    uri: str
    """The tracking URI the run lives in (hand it to the job with the run id)."""
    link: str
    """What to show the user: a URL for a server, a command to run for a sqlite store."""
    artifact_uri: str
    truncated_params: tuple[str, ...] = ()
    """Params whose value was cut to MLflow's 6000 characters (log the full config as an
    artifact to keep it)."""


@dataclass(frozen=True)
class ChildSpec:
    """One task of a sweep: its own run name, params, tags and artifacts."""

    run_name: str
    params: Mapping[str, ParamValue] = field(default_factory=dict)
    tags: Mapping[str, str] = field(default_factory=dict)
    artifacts: Mapping[str, str] = field(default_factory=dict)


def config_params(resolved: ResolvedConfig) -> dict[str, str]:
    """MLflow params: every config leaf as `section.key` (free mappings such as
    job.env key by key), as `stoker submit` and the runtime log them.

    The config refuses secrets (stoker/redact.py); should one get in anyway (a config
    built in code), its value is *** here."""
    return {row.key: _param_value(row.key, row.value) for row in resolved.rows()}


def _param_value(key: str, value: Any) -> str:
    entry = key.split(".", 2)[2:]  # a free mapping's entry: job.env.NAME, tracking.tags.NAME
    if entry and is_secret_name(entry[0]):
        return REDACTED
    return hide_url_passwords(_param_text(value))


def _param_text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return "null" if value is None else str(value)


def _prepare_params(params: Mapping[str, ParamValue]) -> tuple[dict[str, str], tuple[str, ...]]:
    prepared: dict[str, str] = {}
    truncated: list[str] = []
    for key, value in params.items():
        check_key("param", key)
        text = str(value)
        if len(text) > MAX_PARAM_VALUE:
            truncated.append(key)
        prepared[key] = cut(text, MAX_PARAM_VALUE)
    return prepared, tuple(truncated)


def _prepare_tags(tags: Mapping[str, str]) -> dict[str, str]:
    for key in tags:
        check_key("tag", key)
    return {key: cut(str(value), MAX_TAG_VALUE) for key, value in tags.items()}


def _check_artifacts(artifacts: Mapping[str, str]) -> None:
    for name in artifacts:
        if (
            not name
            or posixpath.normpath(name) != name
            or name.startswith(("/", ".."))
            or name.endswith("/")
        ):
            raise StokerError(
                f"artifact file name {name!r} is not a relative path inside the run",
                fix="name artifacts like 'job.sbatch' or 'code/manifest.txt'",
            )


def _check_experiment(name: str) -> None:
    if not name.strip() or len(name) > MAX_EXPERIMENT_NAME:
        raise StokerError(
            f"MLflow experiment name {name!r} must be 1 to {MAX_EXPERIMENT_NAME} characters",
            fix="set tracking.experiment in the experiment config",
        )


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user with no passwd entry and no $USER
        return "unknown"


class _MlflowRuns:
    """What precreate and the submit's updates call, through MLflow's client (a store
    that direct_runs does not write); direct_runs.DirectRuns has the same methods."""

    def __init__(self, client: Any, experiment_id: str) -> None:
        self.client = client
        self.experiment_id = experiment_id

    def create_scheduled(
        self, run_name: str, tags: Mapping[str, str], params: Mapping[str, str], user: str,
        created: list[str],
    ) -> tuple[str, str]:  # fmt: skip
        from mlflow.entities import Param

        run = self.client.create_run(
            self.experiment_id, run_name=run_name, tags={TAG_USER: user, **tags}
        )
        run_id = str(run.info.run_id)
        created.append(run_id)
        # create_run always starts a run as RUNNING; the job moves it on when it starts.
        self.client.update_run(run_id, status="SCHEDULED")
        items = [Param(key, value) for key, value in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):  # MLflow's per-call limit
            self.client.log_batch(run_id, params=items[start : start + PARAMS_PER_BATCH])
        return run_id, str(run.info.artifact_uri)

    def log_texts(self, run_id: str, texts: Mapping[str, str]) -> None:
        for name, text in texts.items():
            self.client.log_text(run_id, text, name)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        for key, value in tags.items():
            self.client.set_tag(run_id, key, value)

    def end(self, run_id: str, status: str) -> None:
        self.client.set_terminated(run_id, status=status)

    def abandon(self, run_id: str, tag: str, reason: str) -> None:
        """One attempt, not the retries (see _abandon)."""
        raw = self.client.raw if isinstance(self.client, RetryingClient) else self.client
        raw.set_tag(run_id, tag, reason)
        raw.set_terminated(run_id, status="FAILED")


@contextmanager
def _runs_of(target: TrackingTarget, experiment: str | None) -> Iterator[Any]:
    """The store's runs, written with sqlite3 where direct_runs can (no mlflow import:
    2-3 CPU-s of a `stoker submit`), else through MLflow's client."""
    direct = open_direct(target, experiment)
    if direct is not None:
        yield direct
        return
    with open_store(target, experiment) as (client, experiment_id):
        yield _MlflowRuns(client, experiment_id)


def _create_run(
    runs: Any,
    target: TrackingTarget,
    *,
    run_name: str,
    params: dict[str, str],
    tags: dict[str, str],
    artifacts: Mapping[str, str],
    truncated: tuple[str, ...],
    created: list[str],
) -> CreatedRun:
    """Create one SCHEDULED run; its id is appended to `created` as soon as it exists."""
    run_id, artifact_uri = runs.create_scheduled(run_name, tags, params, _current_user(), created)
    runs.log_texts(run_id, artifacts)
    return CreatedRun(
        run_id=run_id,
        experiment_id=runs.experiment_id,
        uri=target.uri,
        link=run_link(target, runs.experiment_id, run_id),
        artifact_uri=artifact_uri,
        truncated_params=truncated,
    )


def _abandon(runs: Any, run_ids: Sequence[str], reason: str) -> None:
    """Best effort, while another error is on its way up: no run stays SCHEDULED.

    One attempt per call, not the retries: after a locked store spent its budget, 100
    runs of a sweep must not wait 60 s each."""
    for run_id in run_ids:
        # The error already on its way up is the one to report, not a second one.
        try:
            runs.abandon(run_id, TAG_SUBMIT_ERROR, cut(reason, MAX_TAG_VALUE))
        except Exception as exc:
            if is_locked_error(exc):
                return  # still locked: the others would wait just as long


# --- what `stoker submit`, `stoker sweep` and a job without a run call ------------------


def precreate_run(
    target: TrackingTarget,
    *,
    experiment: str,
    run_name: str,
    params: Mapping[str, ParamValue],
    tags: Mapping[str, str],
    artifacts: Mapping[str, str],
    parent_run_id: str | None = None,
) -> CreatedRun:
    """Create the run a job will log into, in status SCHEDULED: `stoker submit` calls
    it before the job is queued, a job started without `MLFLOW_RUN_ID` at its start.

    The experiment is created if missing, with its artifacts under
    `<artifact_root>/<experiment>` for a sqlite store. `artifacts` maps file names
    ("job.sbatch", "config.yaml") to their text. Param values longer than MLflow's
    6000 characters are cut (listed in `truncated_params`); an invalid param or tag
    name raises StokerError before anything is created. Any store failure raises
    StokerError naming the URI and where it came from; a run that was created before
    the failure is marked FAILED.
    """
    _check_experiment(experiment)
    prepared, truncated = _prepare_params(params)
    all_tags = _prepare_tags(tags)
    if parent_run_id is not None:
        all_tags[TAG_PARENT] = parent_run_id
    _check_artifacts(artifacts)
    created: list[str] = []
    with (
        store_errors(target, f"create a run in experiment {experiment!r}"),
        _runs_of(target, experiment) as runs,
    ):
        try:
            return _create_run(
                runs,
                target,
                run_name=run_name,
                params=prepared,
                tags=all_tags,
                artifacts=artifacts,
                truncated=truncated,
                created=created,
            )
        except Exception as exc:
            _abandon(runs, created, f"stoker submit failed while creating the run: {exc}")
            raise


def precreate_sweep(
    target: TrackingTarget,
    *,
    experiment: str,
    parent_name: str,
    parent_params: Mapping[str, ParamValue],
    parent_tags: Mapping[str, str],
    children: Sequence[ChildSpec],
    parent_artifacts: Mapping[str, str] | None = None,
) -> tuple[CreatedRun, list[CreatedRun]]:
    """One parent run and one child run per sweep task (array index = list index).

    Each child carries `mlflow.parentRunId` (the MLflow UI nests it under the parent)
    and `stoker.sweep.index`. Everything is checked before the first run is created;
    if the store fails half-way, the runs already made are marked FAILED.
    """
    _check_experiment(experiment)
    parent_prepared, parent_truncated = _prepare_params(parent_params)
    parent_all_tags = _prepare_tags(parent_tags)
    _check_artifacts(parent_artifacts or {})
    child_inputs = []
    for index, child in enumerate(children):
        prepared, truncated = _prepare_params(child.params)
        child_tags = _prepare_tags(child.tags)
        child_tags[TAG_SWEEP_INDEX] = str(index)
        _check_artifacts(child.artifacts)
        child_inputs.append((child, prepared, child_tags, truncated))
    created: list[str] = []
    with (
        store_errors(target, f"create the sweep's runs in experiment {experiment!r}"),
        _runs_of(target, experiment) as runs,
    ):
        try:
            parent = _create_run(
                runs,
                target,
                run_name=parent_name,
                params=parent_prepared,
                tags=parent_all_tags,
                artifacts=parent_artifacts or {},
                truncated=parent_truncated,
                created=created,
            )
            children_runs = [
                _create_run(
                    runs,
                    target,
                    run_name=child.run_name,
                    params=prepared,
                    tags={**tags, TAG_PARENT: parent.run_id},
                    artifacts=child.artifacts,
                    truncated=truncated,
                    created=created,
                )
                for child, prepared, tags, truncated in child_inputs
            ]
        except Exception as exc:
            _abandon(runs, created, f"stoker sweep failed while creating the runs: {exc}")
            raise
    return parent, children_runs


TRAINING_LAYOUT = "workflowType=machine_learning"


def run_link(target: TrackingTarget, experiment_id: str, run_id: str) -> str:
    """Where the user sees the run: a URL for a server; for a sqlite store, the command
    that serves it and the URL to open then. The run's metric charts (the loss leads:
    docs/runtime.md), in MLflow's model-training layout, which the UI otherwise takes
    from the browser's last choice (GenAI by default) and not from the experiment's
    kind tag."""
    path = f"#/experiments/{experiment_id}/runs/{run_id}/model-metrics?{TRAINING_LAYOUT}"
    if target.is_server:
        return f"{target.uri}/{path}"
    return (
        f"mlflow ui --backend-store-uri {shlex.quote(target.uri)} --port 5000"
        f"  # then open http://127.0.0.1:5000/{path}"
    )


def mark_run_failed_to_submit(target: TrackingTarget, run_id: str, reason: str) -> None:
    """After sbatch refused the job: set the pre-created run to FAILED with the reason in
    the `stoker.submit_error` tag, so no run waits as SCHEDULED for a job that never came.
    Raises StokerError if the store cannot be reached (the caller decides which error to show).
    """
    with store_errors(target, f"mark run {run_id} as failed"), _runs_of(target, None) as runs:
        runs.set_tags(run_id, {TAG_SUBMIT_ERROR: cut(reason, MAX_TAG_VALUE)})
        runs.end(run_id, "FAILED")


def update_submitted_runs(
    target: TrackingTarget, updates: Mapping[str, tuple[Mapping[str, str], Mapping[str, str]]]
) -> None:
    """`{run_id: (artifacts, tags)}`: what is known only once sbatch answered (the script,
    which names the run ids, and the job id), written with one opening of the store."""
    prepared = {}
    for run_id, (artifacts, tags) in updates.items():
        _check_artifacts(artifacts)
        prepared[run_id] = (artifacts, _prepare_tags(tags))
    with (
        store_errors(target, "record the submitted job in its runs"),
        _runs_of(target, None) as runs,
    ):
        for run_id, (artifacts, tags) in prepared.items():
            runs.log_texts(run_id, artifacts)
            runs.set_tags(run_id, tags)
