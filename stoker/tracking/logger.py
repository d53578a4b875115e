"""The job side of MLflow: one writer per run that never holds up a training step.

Global rank 0 logs metrics, params, tags and artifacts into the run `stoker submit`
pre-created (`MLFLOW_RUN_ID`; a job started without one creates it with
`precreate_run`, stoker/tracking/runs.py). Local rank 0 of every other node logs only
its `SystemSampler` metrics, through a `RunLogger` of its own (its own spool file) on
the same run, and closes it with status None.

    logger = RunLogger(uri, run_id, rundir / "mlflow-spool-rank0.jsonl")
    logger.start()                        # RUNNING; replays what an earlier attempt left
    logger.log_metrics({"loss": 2.3}, step=step)    # enqueues and returns
    logger.close("FINISHED")              # or close(None) before a requeue

Calls enqueue and return (stoker/tracking/record_queue.py); a background thread
(stoker/tracking/writer.py) sends `log_batch` calls every `flush_interval_s`, or as
soon as `max_batch` points wait, and spools them through a store outage. The steps
of a metric key must increase: a point at or below a step already logged for its key
is dropped (stoker/tracking/packing.py), which makes a requeued job's repeated steps
and a replayed spool land exactly once.

Checkpoints (from the checkpoint code, on global rank 0, once `step-<N>` is committed):

    logger.log_checkpoint(step, "s3://bucket/run/step-1000", bytes=n, blocking_s=1.2,
                          background_s=40.0)
    logger.log_final_model(Path("final"), step=step)   # uploads the folder's files

`log_checkpoint` logs the metrics `system/checkpoint/bytes`, `system/checkpoint/blocking_s`,
`system/checkpoint/background_s` and `system/checkpoint/bytes_per_s` (bytes / (blocking_s +
background_s): the save from its start to its commit) at `step`, and registers an
MLflow external logged model `step-<N>`; `log_final_model` a logged model whose
artifacts are the files of a folder (stoker/tracking/logged_models.py).

The data sets the run reads (stoker/tracking/dataset_inputs.py), once per run however
often a requeued job logs them:

    logger.log_dataset_inputs([DataSetInput("train", TRAINING, url, digest, ...)])

mlflow is imported by `start()`, never at module import (1 to 2.7 s here).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from stoker.errors import StokerError
from stoker.metric_names import checkpoint_metrics
from stoker.tracking.dataset_inputs import DataSetInput, dataset_entry
from stoker.tracking.limits import (
    MAX_PARAM_VALUE,
    MAX_TAG_VALUE,
    METRICS_PER_BATCH,
    ParamValue,
    check_key,
    check_model_name,
    cut,
)
from stoker.tracking.logged_models import checkpoint_model, folder_model
from stoker.tracking.record_queue import RecordQueue
from stoker.tracking.spool import Spool
from stoker.tracking.stderr import first_line, warn
from stoker.tracking.writer import StoreWriter

Status = Literal["FINISHED", "FAILED", "KILLED"]

# MLflow's own HTTP retries (7, with backoff: minutes per call to a server that is
# down) would hold the writer and close(); RunLogger retries itself. Set only where
# the user has not set them.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


@dataclass(frozen=True)
class RunLoggerStats:
    """Counters for tests and the trainer's own metrics; points are metric values."""

    queued: int
    """Logged, in memory: neither in the store nor in the spool yet."""
    spooled: int
    """In the spool file, waiting for the store to answer."""
    sent: int
    """Taken by the store."""
    dropped: int
    """At or below a step already logged for their key, or refused by the store."""
    longest_log_s: float
    """The longest `log_metrics` call, in seconds."""
    outages: int
    """Times the store stopped answering."""
    models: int = 0
    """Logged models this logger created (or completed) in the store."""
    datasets: int = 0
    """Dataset inputs this logger added to the run (not those it had already)."""


class RunLogger:
    """Writes metrics, params, tags and artifacts into one MLflow run from a
    background thread; see the module docstring.

    Names of metrics, params and tags are checked when logged (StokerError for a name
    MLflow refuses: a bug to see at the first step, not hours later); nothing else
    raises into training once `start()` has returned. Param values are cut to 6000
    characters and tag values to 8000, as `stoker submit` does.
    """

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        spool_path: Path,
        *,
        flush_interval_s: float = 2.0,
        max_batch: int = 1000,
        retry_max_s: float = 30.0,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.spool_path = Path(spool_path).absolute()
        self.max_batch = max(1, max_batch)
        self._valid_keys: set[str] = set()
        self._longest_log_s = 0.0
        self._queue = RecordQueue(run_id, self.max_batch)
        self._spool = Spool(self.spool_path, run_id)
        self._writer = StoreWriter(
            tracking_uri,
            run_id,
            self._queue,
            self._spool,
            flush_interval_s=flush_interval_s,
            batch_points=min(self.max_batch, METRICS_PER_BATCH),
            retry_max_s=retry_max_s,
        )

    @property
    def run_start_s(self) -> float | None:
        """The run's start time (epoch seconds) as the store said at start; None until then."""
        return self._writer.run_start_s

    def start(self) -> None:
        """Open the store, mark the run RUNNING, replay the spool an earlier attempt
        left, learn the highest step of each key, and start the writer thread.

        A store that does not answer is not an error (the thread keeps trying and the
        data waits in the spool); a run that does not exist, mlflow missing, or an
        unreadable spool raise StokerError.
        """
        if self._writer.started:
            return
        self._spool.count()
        if self.tracking_uri.startswith(("http://", "https://")):
            for name, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(name, value)
        try:
            import mlflow.tracking  # noqa: F401  (the client is made by the writer's connect)
        except ImportError as exc:
            raise StokerError(
                f"cannot import mlflow to log into {self.tracking_uri}: {exc}",
                fix="install it in the job's environment: pip install 'mlflow>=3.5'",
            ) from exc
        self._writer.connect(at_start=True)
        self._writer.start()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Enqueue one step's values (NaN and inf included) and return.

        Pass Python floats: `float()` of a GPU tensor here would wait for the GPU.
        Steps of a key must increase; see the module docstring.
        """
        started = time.perf_counter()
        for key in metrics:
            if key not in self._valid_keys:
                check_key("metric", key)
                self._valid_keys.add(key)
        stamp = int(time.time() * 1000)
        points = [[key, float(value), stamp, int(step)] for key, value in metrics.items()]
        self._queue.put({"run": self.run_id, "m": points}, len(points))
        elapsed = time.perf_counter() - started
        if elapsed > self._longest_log_s:
            self._longest_log_s = elapsed

    def log_params(self, params: Mapping[str, ParamValue]) -> None:
        """Enqueue params. One already in the run with an equal value is skipped (a
        requeued job logs them again); one with another value is not sent (MLflow
        refuses to change a param) and is reported once on stderr."""
        prepared: dict[str, str] = {}
        for key, value in params.items():
            check_key("param", key)
            prepared[key] = cut(str(value), MAX_PARAM_VALUE)
        self._queue.put({"run": self.run_id, "p": prepared}, 0)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Enqueue tags (a tag set again takes the new value)."""
        prepared: dict[str, str] = {}
        for key, value in tags.items():
            check_key("tag", key)
            prepared[key] = cut(str(value), MAX_TAG_VALUE)
        self._queue.put({"run": self.run_id, "t": prepared}, 0)

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        """Enqueue the upload of a file or folder into the run's artifacts (under
        `artifact_path`). It is read when the thread uploads it, maybe after an outage
        or in the next attempt: leave it in place. Never raises."""
        self._queue.put(
            {"run": self.run_id, "a": [str(Path(local_path).absolute()), artifact_path]}, 0
        )

    def log_checkpoint(
        self, step: int, uri: str, *, bytes: int, blocking_s: float, background_s: float
    ) -> None:
        """Enqueue the record of checkpoint `step-<step>`, committed at `uri`, and return:
        the `checkpoint/*` metrics at `step`, and an external logged model `step-<step>`
        (see the module docstring). `bytes`: its size; `blocking_s`: how long training
        waited for it; `background_s`: how long the rest of the save took. Never raises."""
        try:
            step = int(step)
            size = int(bytes)
            values = checkpoint_metrics(size, blocking_s, background_s)
            stamp = int(time.time() * 1000)
            points = [[key, value, stamp, step] for key, value in values.items()]
            model = checkpoint_model(step, uri, size, points)
            self._queue.put({"run": self.run_id, "m": points, "lm": model}, len(points))
        except Exception as exc:  # a record must never stop training
            warn(f"checkpoint step-{step} is not recorded in MLflow: {first_line(exc)}")

    def log_final_model(self, local_dir: Path, *, step: int, name: str = "final") -> None:
        """Enqueue a logged model `name` of this run whose artifacts are the files of
        `local_dir` (param `step`), and return. The files are read when the thread
        uploads them, maybe after an outage or in the next attempt: leave them in place.
        Raises StokerError for a name MLflow refuses; nothing else."""
        check_model_name(name)
        model = folder_model(local_dir, step=step, name=name)
        self._queue.put({"run": self.run_id, "lm": model}, 0)

    def log_dataset_inputs(self, inputs: Sequence[DataSetInput]) -> None:
        """Enqueue the data sets the run reads as its dataset inputs, and return; one
        the run has already (same name and digest) is not logged again. Never raises."""
        try:
            entries = [dataset_entry(data_set) for data_set in inputs]
        except Exception as exc:  # a record must never stop training
            warn(f"the run's data sets are not recorded in MLflow: {first_line(exc)}")
            return
        if entries:
            self._queue.put({"run": self.run_id, "ds": entries}, 0)

    def close(self, status: Status | None, timeout_s: float = 30.0) -> None:
        """Send what can be sent within `timeout_s`, then set the run's terminal
        status, unless `status` is None (a job about to be requeued: the next attempt
        continues the run). What is left stays in the spool for the next attempt,
        and a warning says so."""
        if self._queue.close():
            self._writer.close(status, timeout_s)

    def pending(self) -> int:
        """Points not yet in the store: queued in memory plus spooled."""
        return self._queue.waiting + self._writer.in_hand + self._spool.points

    def stats(self) -> RunLoggerStats:
        writer = self._writer
        return RunLoggerStats(
            queued=self._queue.waiting + writer.in_hand,
            spooled=self._spool.points,
            sent=writer.sent,
            dropped=writer.packer.dropped + writer.refused,
            longest_log_s=self._longest_log_s,
            outages=writer.outages,
            models=writer.models,
            datasets=writer.datasets,
        )
