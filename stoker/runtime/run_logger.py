"""The job side of MLflow: one writer per run that never holds up a training step.

Global rank 0 logs metrics, params, tags and artifacts into the run `stoker submit`
pre-created (`MLFLOW_RUN_ID`; `ensure_run` makes one for `stoker run`). Local rank 0
of every other node logs only its `SystemSampler` metrics, through a `RunLogger` of
its own (its own spool file) on the same run, and closes it with status None.

    logger = RunLogger(uri, run_id, rundir / "mlflow-spool-rank0.jsonl")
    logger.start()                        # RUNNING; replays what an earlier attempt left
    logger.log_metrics({"loss": 2.3}, step=step)    # enqueues and returns
    logger.close("FINISHED")              # or close(None) before a requeue

Calls enqueue and return; a background thread sends `log_batch` calls (500 points
took 0.03 s, against 1.3 s as 500 `log_metric` calls) every `flush_interval_s`, or as
soon as `max_batch` points wait.

When the store does not answer (connection refused, HTTP 5xx, sqlite locked...)
training goes on: the batch that failed and every later one are appended to the
spool file (JSONL, one batch per line, fsync'd), the thread retries with exponential
backoff up to `retry_max_s`, and when the store answers it replays the spool in
order, truncates it and goes on. A job killed meanwhile leaves the spool behind; the
next attempt's `start()` replays it.

Exactly once, per metric key: a requeued job resumes from its last checkpoint and
computes some steps again, and a batch the store took just as the connection broke
is sent again from the spool. So the steps of a key must increase: a point whose
step is at or below the highest step already logged for its key (in the store, or
sent or spooled by this logger) is dropped. The store's highest step per key is read
at `start()` and again each time the store answers after an outage, from the run's
latest metrics (MLflow keeps, per key, the point with the highest step). The first
value logged for a (key, step) wins.

Checkpoints (from the checkpoint code, on global rank 0, once `step-<N>` is committed):

    logger.log_checkpoint(step, "s3://bucket/run/step-1000", bytes=n, blocking_s=1.2,
                          background_s=40.0)
    logger.log_final_model(Path("final"), step=step)   # uploads the folder's files

`log_checkpoint` logs the metrics `checkpoint/bytes`, `checkpoint/blocking_s`,
`checkpoint/background_s` and `checkpoint/bytes_per_s` (bytes / (blocking_s +
background_s): the save from its start to its commit) at `step`, and registers an
MLflow external logged model `step-<N>` (source run: this run; params step, uri, bytes; tags
`stoker.checkpoint.step`, `stoker.checkpoint.uri`, `mlflow.model.isExternal`; the same
metrics as model metrics; a run output at `step`). Nothing of the checkpoint is
uploaded: MLflow records where it is. `log_final_model` creates a logged model from
the run whose artifacts are the files of a folder, uploaded when the thread sends it.
Both go through the queue and the spool like the rest, and a model is created once:
before creating one, the thread looks for a model of this run with that name (a spool
replayed twice, a create the store took as the connection broke) and completes it if
it is still PENDING, or skips it if READY.

The records of the queue and of the spool, one JSON object per spool line:

    {"run": id, "m": [[key, value, ms, step], ...], "p": {key: value}, "t": {key: value}}
    {"run": id, "a": [local_path, artifact_path]}           one artifact upload
    {"run": id, "lm": {"name", "step", "params", "tags", "metrics", "dir"}}
                                                            one logged model
    (`log_checkpoint` queues "m" and "lm" in one record; the model metrics are then
    the points the run takes, so that a point dropped by the step rule does not come
    back as a model metric.) "dir" is None for an external model, else the folder
    whose files are uploaded. A record with none of these keys (a later version's
    kind) is skipped.

mlflow is imported by `start()`, never at module import (1 to 2.7 s here).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, cast

from stoker.errors import StokerError
from stoker.launcher.tracking import (
    MAX_PARAM_VALUE,
    MAX_TAG_VALUE,
    PARAMS_PER_BATCH,
    ParamValue,
    _check_key,
    _cut,
    precreate_run,
    resolve_tracking_uri,
)

Status = Literal["FINISHED", "FAILED", "KILLED"]

# MLflow's limits on one log_batch call (mlflow/utils/validation.py): 1000 metrics,
# 100 params, 100 tags, 1000 entities in all, and a request body under 1 MB.
METRICS_PER_BATCH = 1000
TAGS_PER_BATCH = 100
ENTITIES_PER_BATCH = 1000
MAX_BATCH_CHARS = 900_000
# First wait after a failed call; it doubles up to retry_max_s.
FIRST_RETRY_S = 0.5
# MLflow's own HTTP retries (7, with backoff: minutes per call to a server that is
# down) would hold the writer and close(); RunLogger retries itself. Set only where
# the user has not set them.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
# Extra seconds close() waits for a store call already under way.
CLOSE_GRACE_S = 1.0

# The tag MLflow's create_external_model sets (mlflow/utils/mlflow_tags.py).
EXTERNAL_MODEL_TAG = "mlflow.model.isExternal"
# What MLflow refuses in a logged model's name (mlflow/utils/validation.py); a quote would
# also break the search filter that keeps models exactly once.
_BAD_MODEL_NAME_CHARS = ("/", ":", ".", "%", '"', "'")
MAX_MODEL_NAME = 500

# One queue entry, one spool line; the kinds are in the module docstring.
_Record = dict[str, Any]


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


@dataclass
class _Batch:
    """What one store call sends: a log_batch, one artifact upload, or one logged model
    (a few calls)."""

    metrics: list[list[Any]] = field(default_factory=list)
    params: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifact: list[str | None] | None = None
    model: dict[str, Any] | None = None
    chars: int = 0

    @property
    def points(self) -> int:
        return len(self.metrics)

    def empty(self) -> bool:
        return not (self.metrics or self.params or self.tags or self.artifact or self.model)

    def full(self, chars: int) -> bool:
        entities = len(self.metrics) + len(self.params) + len(self.tags)
        return entities >= ENTITIES_PER_BATCH or self.chars + chars > MAX_BATCH_CHARS

    def record(self, run_id: str) -> _Record:
        if self.artifact is not None:
            return {"run": run_id, "a": self.artifact}
        if self.model is not None:
            return {"run": run_id, "lm": self.model}
        record: _Record = {"run": run_id}
        if self.metrics:
            record["m"] = self.metrics
        if self.params:
            record["p"] = self.params
        if self.tags:
            record["t"] = self.tags
        return record


class _StoreDown(Exception):
    """A store call failed in a way that may pass: keep the data, retry later."""


def _warn(message: str) -> None:
    print(f"stoker: warning: {message}", file=sys.stderr, flush=True)


def _check_model_name(name: str) -> None:
    if not name or len(name) > MAX_MODEL_NAME or any(c in name for c in _BAD_MODEL_NAME_CHARS):
        raise StokerError(
            f"{name!r} is not a name MLflow takes for a logged model",
            fix=f"use 1 to {MAX_MODEL_NAME} characters without any of "
            f"{' '.join(_BAD_MODEL_NAME_CHARS)}",
        )


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0] if len(lines[0]) <= 300 else lines[0][:300] + "..."


def _is_transient(exc: Exception) -> bool:
    """True where waiting may help: no answer, 5xx, 408, 429, a locked or busy store."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        # A refused connection and exhausted HTTP retries arrive as INTERNAL_ERROR (500).
        code = int(cast(Any, exc).get_http_status_code())  # untyped in mlflow
        return code >= 500 or code in (408, 429)
    # Our own bugs would fail the same way forever; SQLAlchemy and requests errors pass.
    return not isinstance(exc, (TypeError, ValueError, AttributeError, KeyError))


class RunLogger:
    """Writes metrics, params, tags and artifacts into one MLflow run from a
    background thread; see the module docstring for the spool and the step rule.

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
        self.flush_interval_s = flush_interval_s
        self.max_batch = max(1, max_batch)
        self._batch_points = min(self.max_batch, METRICS_PER_BATCH)
        self.retry_max_s = max(retry_max_s, FIRST_RETRY_S)
        self.run_start_s: float | None = None
        """The run's start time (epoch seconds) as the store said at start; None until then."""

        # Shared with the training thread(s), under _lock.
        self._lock = threading.Lock()
        self._queue: deque[_Record] = deque()
        self._waiting = 0
        self._valid_keys: set[str] = set()
        self._longest_log_s = 0.0
        self._closed = False
        self._warned_after_close = False

        # The writer thread's state; close() touches it only under _spool_lock, after
        # the thread failed to stop in time.
        self._spool_lock = threading.Lock()
        self._inflight: list[_Batch] = []
        self._abandoned = False
        self._client: Any = None
        self._experiment_id: str | None = None
        self._connected = False
        self._marked_running = False
        self._in_outage = False
        self._backoff = FIRST_RETRY_S
        self._next_try = 0.0
        self._maxes: dict[str, int] = {}
        self._params: dict[str, str] = {}
        self._warned_params: set[str] = set()
        self._warned_errors: set[str] = set()
        self._in_hand = 0
        self._spooled = 0
        self._sent = 0
        self._dropped = 0
        self._models = 0
        self._outages = 0

        self._wake = threading.Event()
        self._closing = threading.Event()
        self._deadline = math.inf
        self._final_status: Status | None = None
        self._status_set = False
        self._thread: threading.Thread | None = None

    # --- what the trainer calls --------------------------------------------------------

    def start(self) -> None:
        """Open the store, mark the run RUNNING, replay the spool an earlier attempt
        left, learn the highest step of each key, and start the writer thread.

        A store that does not answer is not an error (the thread keeps trying and the
        data waits in the spool); a run that does not exist, mlflow missing, or an
        unreadable spool raise StokerError.
        """
        if self._thread is not None:
            return
        self._spooled = sum(len(r.get("m", ())) for r in self._spool_records(warn=False))
        if self.tracking_uri.startswith(("http://", "https://")):
            for name, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(name, value)
        try:
            import mlflow.tracking  # noqa: F401  (the client is made in _connect)
        except ImportError as exc:
            raise StokerError(
                f"cannot import mlflow to log into {self.tracking_uri}: {exc}",
                fix="install it in the job's environment: pip install 'mlflow>=3.5'",
            ) from exc
        self._connect(at_start=True)
        self._thread = threading.Thread(target=self._run, name="stoker-run-logger", daemon=True)
        self._thread.start()

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Enqueue one step's values (NaN and inf included) and return.

        Pass Python floats: `float()` of a GPU tensor here would wait for the GPU.
        Steps of a key must increase; see the module docstring.
        """
        started = time.perf_counter()
        for key in metrics:
            if key not in self._valid_keys:
                _check_key("metric", key)
                self._valid_keys.add(key)
        stamp = int(time.time() * 1000)
        points = [[key, float(value), stamp, int(step)] for key, value in metrics.items()]
        self._enqueue({"run": self.run_id, "m": points}, len(points))
        elapsed = time.perf_counter() - started
        if elapsed > self._longest_log_s:
            self._longest_log_s = elapsed

    def log_params(self, params: Mapping[str, ParamValue]) -> None:
        """Enqueue params. One already in the run with an equal value is skipped (a
        requeued job logs them again); one with another value is not sent (MLflow
        refuses to change a param) and is reported once on stderr."""
        prepared: dict[str, str] = {}
        for key, value in params.items():
            _check_key("param", key)
            prepared[key] = _cut(str(value), MAX_PARAM_VALUE)
        self._enqueue({"run": self.run_id, "p": prepared}, 0)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Enqueue tags (a tag set again takes the new value)."""
        prepared: dict[str, str] = {}
        for key, value in tags.items():
            _check_key("tag", key)
            prepared[key] = _cut(str(value), MAX_TAG_VALUE)
        self._enqueue({"run": self.run_id, "t": prepared}, 0)

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        """Enqueue the upload of a file or folder into the run's artifacts (under
        `artifact_path`). It is read when the thread uploads it, maybe after an outage
        or in the next attempt: leave it in place. Never raises."""
        self._enqueue(
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
            values = {
                "checkpoint/bytes": float(size),
                "checkpoint/blocking_s": float(blocking_s),
                "checkpoint/background_s": float(background_s),
            }
            seconds = float(blocking_s) + float(background_s)  # the save, start to commit
            if seconds > 0:
                values["checkpoint/bytes_per_s"] = size / seconds
            stamp = int(time.time() * 1000)
            points = [[key, value, stamp, step] for key, value in values.items()]
            model = {
                "name": f"step-{step}",
                "step": step,
                "params": {
                    "step": str(step),
                    "uri": _cut(str(uri), MAX_PARAM_VALUE),
                    "bytes": str(size),
                },
                "tags": {
                    EXTERNAL_MODEL_TAG: "true",
                    "stoker.checkpoint.step": str(step),
                    "stoker.checkpoint.uri": _cut(str(uri), MAX_TAG_VALUE),
                },
                "metrics": points,
                "dir": None,
            }
            self._enqueue({"run": self.run_id, "m": points, "lm": model}, len(points))
        except Exception as exc:  # a record must never stop training
            _warn(f"checkpoint step-{step} is not recorded in MLflow: {_first_line(exc)}")

    def log_final_model(self, local_dir: Path, *, step: int, name: str = "final") -> None:
        """Enqueue a logged model `name` of this run whose artifacts are the files of
        `local_dir` (param `step`), and return. The files are read when the thread
        uploads them, maybe after an outage or in the next attempt: leave them in place.
        Raises StokerError for a name MLflow refuses; nothing else."""
        _check_model_name(name)
        model = {
            "name": name,
            "step": int(step),
            "params": {"step": str(int(step))},
            "tags": {},
            "metrics": [],
            "dir": str(Path(local_dir).absolute()),
        }
        self._enqueue({"run": self.run_id, "lm": model}, 0)

    def close(self, status: Status | None, timeout_s: float = 30.0) -> None:
        """Send what can be sent within `timeout_s`, then set the run's terminal
        status, unless `status` is None (a job about to be requeued: the next attempt
        continues the run). What is left stays in the spool for the next attempt,
        and a warning says so."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._thread is None:  # never started: keep what was logged for a later start()
            with self._spool_lock:
                self._abandoned = True
                self._write_spool(list(self._take()))
            self._in_hand = 0
            self._report_leftovers(status)
            return
        self._final_status = status
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout_s + CLOSE_GRACE_S)
        # Nothing is left in hand unless the thread is stuck in a store call or died:
        # keep that in the spool (the next start() drops what the stuck call may still
        # manage to send).
        with self._spool_lock:
            self._abandoned = True
            with self._lock:
                queued, self._queue = self._queue, deque()
                self._waiting = 0
            self._write_spool([b.record(self.run_id) for b in self._inflight] + list(queued))
            self._inflight = []
        self._report_leftovers(status)

    def pending(self) -> int:
        """Points not yet in the store: queued in memory plus spooled."""
        return self._waiting + self._in_hand + self._spooled

    def stats(self) -> RunLoggerStats:
        return RunLoggerStats(
            queued=self._waiting + self._in_hand,
            spooled=self._spooled,
            sent=self._sent,
            dropped=self._dropped,
            longest_log_s=self._longest_log_s,
            outages=self._outages,
            models=self._models,
        )

    # --- the training thread's side --------------------------------------------------

    def _enqueue(self, record: _Record, points: int) -> None:
        with self._lock:
            if self._closed:
                if not self._warned_after_close:
                    self._warned_after_close = True
                    _warn(f"RunLogger for run {self.run_id} got data after close(): dropped")
                return
            self._queue.append(record)
            self._waiting += points
            wake = self._waiting >= self.max_batch or points == 0
        if wake:
            self._wake.set()

    def _take(self) -> deque[_Record]:
        # O(1) under the lock: a writer preempted while holding it would stall the trainer.
        with self._lock:
            records, self._queue = self._queue, deque()
            self._in_hand += self._waiting
            self._waiting = 0
        return records

    # --- the writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._work()
        except Exception as exc:  # a bug here must not end training
            _warn(
                f"the MLflow writer of run {self.run_id} stopped: {type(exc).__name__}: "
                f"{_first_line(exc)}; what is logged from now on is written to "
                f"{self.spool_path} at close()"
            )

    def _work(self) -> None:
        while True:
            now = time.monotonic()
            timeout = self.flush_interval_s
            if not self._connected:
                timeout = min(timeout, max(0.0, self._next_try - now))
            if self._closing.is_set():
                timeout = 0.0 if self._connected else min(timeout, max(0.0, self._deadline - now))
            self._wake.wait(timeout)
            self._wake.clear()
            closing = self._closing.is_set()
            if not self._connected and time.monotonic() >= self._next_try:
                self._connect(at_start=False)
            with self._spool_lock:
                if self._abandoned:
                    return
                self._inflight = list(self._pack(self._take()))
                self._in_hand = sum(b.points for b in self._inflight)
            if self._connected:
                self._deliver()
            elif not self._spool_inflight():
                return
            self._in_hand = 0
            if closing and (
                (self._connected and not self._waiting) or time.monotonic() >= self._deadline
            ):
                break
        if self._connected and self._final_status is not None and not self._abandoned:
            try:
                self._client.set_terminated(self.run_id, status=self._final_status)
                self._status_set = True
            except Exception as exc:
                _warn(
                    f"could not set run {self.run_id} to {self._final_status} in MLflow store "
                    f"{self.tracking_uri}: {_first_line(exc)}"
                )

    def _connect(self, *, at_start: bool) -> None:
        """Learn the run's state, mark it RUNNING, replay the spool; on a failure that
        may pass, note the outage (at start, a missing run raises StokerError)."""
        try:
            if self._client is None:
                # A sqlite store is opened (and its schema checked) here: a process that
                # holds its lock (a rank frozen mid-write) makes this an outage too.
                from mlflow.tracking import MlflowClient

                self._client = MlflowClient(tracking_uri=self.tracking_uri)
            run = self._client.get_run(self.run_id)
            if run.info.lifecycle_stage == "deleted":
                raise StokerError(
                    f"MLflow run {self.run_id} in {self.tracking_uri} is deleted",
                    fix="restore it (`mlflow runs restore --run-id ...`) or log into another run",
                )
            self._experiment_id = str(run.info.experiment_id)
            maxes = {m.key: int(m.step) for m in run.to_proto().data.metrics}
            params = dict(run.data.params)
            if not self._marked_running:
                self._client.update_run(self.run_id, status="RUNNING")
                self._marked_running = True
            self.run_start_s = run.info.start_time / 1000 if run.info.start_time else None
            self._maxes, self._params = maxes, params
            replayed = self._replay()
        except StokerError as exc:
            if at_start:
                raise
            self._outage(exc)
            return
        except _StoreDown as exc:
            self._outage(exc)
            return
        except Exception as exc:
            if at_start and not _is_transient(exc):
                raise StokerError(
                    f"MLflow store {self.tracking_uri}: cannot log into run {self.run_id}: "
                    f"{_first_line(exc)}",
                    fix="check MLFLOW_RUN_ID and the tracking URI the job was given",
                ) from exc
            self._outage(exc)
            return
        self._connected = True
        self._backoff = FIRST_RETRY_S
        if self._in_outage:
            self._in_outage = False
            print(
                f"stoker: MLflow store {self.tracking_uri} answers again: replayed "
                f"{replayed} points from {self.spool_path}",
                file=sys.stderr,
                flush=True,
            )
        elif replayed:
            print(
                f"stoker: replayed {replayed} points an earlier attempt left in "
                f"{self.spool_path} into run {self.run_id}",
                file=sys.stderr,
                flush=True,
            )

    def _outage(self, exc: Exception) -> None:
        self._connected = False
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)
        if not self._in_outage:
            self._in_outage = True
            self._outages += 1
            cause = exc.__cause__ if isinstance(exc, _StoreDown) and exc.__cause__ else exc
            _warn(
                f"MLflow store {self.tracking_uri} does not answer ({_first_line(cause)}); "
                f"training goes on, and metrics wait in {self.spool_path} until it does "
                f"(retrying every {self.retry_max_s:g} s at most)"
            )

    def _deliver(self) -> None:
        """Send the batches in hand; at the first failure that may pass, spool them all."""
        while self._inflight:
            batch = self._inflight[0]
            try:
                self._send(batch)
            except _StoreDown as exc:
                if self._spool_inflight():
                    self._outage(exc)
                return
            with self._spool_lock:
                if self._abandoned:
                    return
                self._inflight.pop(0)
                self._in_hand -= batch.points

    def _send(self, batch: _Batch) -> None:
        """One store call. Raises _StoreDown where retrying may help; drops the batch
        with a warning (once per kind of error) where the store refused it."""
        try:
            if batch.model is not None:
                self._send_model(batch)
                return
            if batch.artifact is not None:
                local, artifact_path = batch.artifact
                path = Path(str(local))
                if not path.exists():
                    self._refused(batch, f"artifact {path} no longer exists")
                    return
                if path.is_dir():
                    self._client.log_artifacts(self.run_id, str(path), artifact_path)
                else:
                    self._client.log_artifact(self.run_id, str(path), artifact_path)
                return
            from mlflow.entities import Metric, Param, RunTag

            self._client.log_batch(
                self.run_id,
                metrics=[Metric(k, v, ts, step) for k, v, ts, step in batch.metrics],
                params=[Param(k, v) for k, v in batch.params.items()],
                tags=[RunTag(k, v) for k, v in batch.tags.items()],
                synchronous=True,
            )
        except Exception as exc:
            if _is_transient(exc):
                raise _StoreDown(_first_line(exc)) from exc
            self._refused(batch, _first_line(exc))
            return
        self._sent += batch.points

    def _send_model(self, batch: _Batch) -> None:
        """Create the logged model of `batch.model`, or complete the one of this run with
        that name that a call cut short left PENDING; a READY one was sent before.
        The calls in order: create (PENDING, params, tags), upload (the folder's files,
        or the MLmodel file that makes an external model registrable), model metrics,
        run output, READY."""
        from mlflow.entities import LoggedModelOutput, Metric

        model = cast(dict[str, Any], batch.model)
        name, local = str(model["name"]), model.get("dir")
        if local is not None and not Path(local).is_dir():
            self._refused(batch, f"folder {local} no longer exists")
            return
        found = self._find_model(name)
        if found is not None and str(found.status) == "READY":
            return
        if found is None:
            found = self._client.create_logged_model(
                experiment_id=self._experiment_id,
                name=name,
                source_run_id=self.run_id,
                tags=model.get("tags") or None,
                params=model.get("params") or None,
            )
            linked = False
        else:
            outputs = getattr(self._client.get_run(self.run_id).outputs, "model_outputs", None)
            linked = any(output.model_id == found.model_id for output in outputs or ())
        model_id = found.model_id
        if local is None:
            self._upload_external_spec(found)
        else:
            self._client.log_model_artifacts(model_id, str(local))
        if model.get("metrics"):
            # The run's own points again (same key, value, time, step): MLflow keeps one
            # row per run point and adds the model's, as its own log_model does.
            self._client.log_batch(
                self.run_id,
                metrics=[
                    Metric(k, v, ts, step, model_id=model_id) for k, v, ts, step in model["metrics"]
                ],
                synchronous=True,
            )
        if not linked:
            self._client.log_outputs(
                self.run_id, [LoggedModelOutput(model_id, step=int(model["step"]))]
            )
        self._client.finalize_logged_model(model_id, "READY")
        self._models += 1

    def _find_model(self, name: str) -> Any:
        """This run's logged model `name` (READY first), or None."""
        found = list(
            self._client.search_logged_models(
                [self._experiment_id],
                filter_string=f"source_run_id = '{self.run_id}' AND name = '{name}'",
                max_results=50,
            )
        )
        ready = [m for m in found if str(m.status) == "READY"]
        return (ready or found or [None])[0]

    def _upload_external_spec(self, model: Any) -> None:
        """The MLmodel file mlflow.create_external_model writes: it says the artifacts
        live elsewhere, and lets the model be registered in the Model Registry."""
        import tempfile

        from mlflow.models.model import MLMODEL_FILE_NAME
        from mlflow.models.utils import get_external_mlflow_model_spec

        with tempfile.TemporaryDirectory(prefix="stoker-mlmodel-") as folder:
            get_external_mlflow_model_spec(model).save(os.path.join(folder, MLMODEL_FILE_NAME))
            self._client.log_model_artifacts(model.model_id, folder)

    def _refused(self, batch: _Batch, reason: str) -> None:
        self._dropped += batch.points
        kind = reason[:80]
        if kind not in self._warned_errors:
            self._warned_errors.add(kind)
            if batch.model is not None:
                what = f"logged model {batch.model['name']!r}"
            elif batch.artifact is not None:
                what = f"artifact {batch.artifact[0]}"
            else:
                what = f"{batch.points} points, {len(batch.params)} params, {len(batch.tags)} tags"
            _warn(
                f"MLflow store {self.tracking_uri} refused {what} for run {self.run_id}: "
                f"{reason}; dropped (later errors like this one are not reported)"
            )

    def _pack(self, records: Iterable[_Record]) -> Iterator[_Batch]:
        """Batches within MLflow's limits, in order, without the points at or below a
        step already logged for their key, nor params already in the run."""
        batch = _Batch()
        for record in records:
            if "a" in record:
                if not batch.empty():
                    yield batch
                    batch = _Batch()
                yield _Batch(artifact=list(record["a"]))
                continue
            taken: set[tuple[str, int]] = set()
            for key, value, stamp, step in record.get("m", ()):
                if step <= self._maxes.get(key, -1):
                    self._dropped += 1
                    continue
                self._maxes[key] = step
                taken.add((key, step))
                if len(batch.metrics) >= self._batch_points or batch.full(len(key) + 40):
                    yield batch
                    batch = _Batch()
                batch.metrics.append([key, value, stamp, step])
                batch.chars += len(key) + 40
            for key, value in record.get("p", {}).items():
                known = self._params.get(key)
                if known == value:
                    continue
                if known is not None:
                    if key not in self._warned_params:
                        self._warned_params.add(key)
                        _warn(
                            f"param {key!r} of run {self.run_id} is {known!r} in MLflow; the "
                            f"new value {value!r} is not logged (MLflow refuses to change a "
                            "param: log it as a metric or a tag, or start a new run)"
                        )
                    continue
                self._params[key] = value
                size = len(key) + len(value) + 20
                if len(batch.params) >= PARAMS_PER_BATCH or batch.full(size):
                    yield batch
                    batch = _Batch()
                batch.params[key] = value
                batch.chars += size
            for key, value in record.get("t", {}).items():
                size = len(key) + len(value) + 20
                if key not in batch.tags and (
                    len(batch.tags) >= TAGS_PER_BATCH or batch.full(size)
                ):
                    yield batch
                    batch = _Batch()
                batch.tags[key] = value
                batch.chars += size
            if "lm" in record:
                model = dict(record["lm"])
                if "m" in record:  # as logged: model metrics for the points the run takes
                    model["metrics"] = [
                        p for p in model.get("metrics", ()) if (p[0], p[3]) in taken
                    ]
                if not batch.empty():  # the run's points go first
                    yield batch
                    batch = _Batch()
                yield _Batch(model=model)
        if not batch.empty():
            yield batch

    # --- the spool -------------------------------------------------------------------------

    def _spool_inflight(self) -> bool:
        """Append the batches in hand to the spool; False if close() gave up on this
        thread (it spooled them itself)."""
        with self._spool_lock:
            if self._abandoned:
                return False
            self._write_spool([b.record(self.run_id) for b in self._inflight])
            self._in_hand -= sum(b.points for b in self._inflight)
            self._inflight = []
        return True

    def _write_spool(self, records: list[_Record]) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        try:
            self.spool_path.parent.mkdir(parents=True, exist_ok=True)
            with self.spool_path.open("a") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as exc:
            _warn(
                f"cannot write the MLflow spool {self.spool_path}: {exc}; "
                f"{sum(len(r.get('m', ())) for r in records)} points are lost"
            )
            return
        self._spooled += sum(len(r.get("m", ())) for r in records)

    def _spool_records(self, *, warn: bool = True) -> Iterator[_Record]:
        try:
            handle: IO[str] = self.spool_path.open()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StokerError(
                f"cannot read the MLflow spool {self.spool_path}: {exc}",
                fix="make it readable, or move it away (its points are then not sent)",
            ) from exc
        with handle:
            yield from self._parse_spool(handle, warn=warn)

    def _parse_spool(self, handle: IO[str], *, warn: bool) -> Iterator[_Record]:
        bad_lines = 0
        other_runs: set[str] = set()
        for line in handle:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                bad_lines += 1  # a write cut short when the job was killed
                continue
            if not isinstance(record, dict):
                bad_lines += 1
            elif record.get("run") != self.run_id:
                other_runs.add(str(record.get("run")))
            else:
                yield record
        if warn and bad_lines:
            _warn(f"{bad_lines} unreadable lines of {self.spool_path} skipped")
        if warn and other_runs:
            _warn(
                f"{self.spool_path} holds data of other runs ({', '.join(sorted(other_runs))}); "
                f"not sent to run {self.run_id}, and dropped with the spool"
            )

    def _replay(self) -> int:
        """Send the spool in order, then truncate it. Raises _StoreDown (the spool is
        kept whole: the next try drops what this one sent)."""
        if not self.spool_path.exists() or self.spool_path.stat().st_size == 0:
            return 0
        replayed = 0
        for batch in self._pack(self._spool_records()):
            if self._closing.is_set() and time.monotonic() >= self._deadline:
                raise _StoreDown("close() timed out during the replay")
            self._send(batch)
            replayed += batch.points
        with self._spool_lock:
            if not self._abandoned:
                with self.spool_path.open("r+") as handle:
                    handle.truncate(0)
                    os.fsync(handle.fileno())
                self._spooled = 0
        return replayed

    def _report_leftovers(self, status: Status | None) -> None:
        left = self._spooled + self._waiting
        if left or self._spool_has_data():
            wanted = f"; run {self.run_id} stays RUNNING, not {status}" if status else ""
            _warn(
                f"MLflow store {self.tracking_uri} did not take everything before close(): "
                f"{left} points stay in {self.spool_path}, and the next start() of a "
                f"RunLogger on this run and spool sends them{wanted}"
            )
        elif status is not None and not self._status_set:
            _warn(f"run {self.run_id} stays RUNNING, not {status}")

    def _spool_has_data(self) -> bool:
        try:
            return self.spool_path.stat().st_size > 0
        except OSError:
            return False


class SystemSampler:
    """Samples this node's CPU, memory and GPUs every `interval_s` into a RunLogger.

    Keys: `system/<node>/cpu_percent` (all cores, 0-100), `system/<node>/memory_gb`
    (used: total minus available, 1e9 bytes), and per visible GPU (CUDA_VISIBLE_DEVICES
    order, as torch numbers them) `system/<node>/gpu<i>/utilization` (percent),
    `.../gpu<i>/memory_gb` and `.../gpu<i>/power_w`, when pynvml (nvidia-ml-py) is
    importable.

    The step is whole seconds since the run started (the store's start time, read by
    `RunLogger.start()`; this sampler's start when the store did not answer then): a
    node other than rank 0's does not know the training step, seconds put every node
    on one axis, and they keep growing across requeues, so a requeued job's samples
    are not taken for steps already logged. Samples less than a second apart share a
    step and only the first is kept.
    """

    def __init__(
        self, logger: RunLogger, *, interval_s: float = 10.0, node: str | None = None
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        name = node or os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
        self.node = re.sub(r"[^\w.\-]", "_", name) or "node"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._origin = time.time()
        self._last_cpu: tuple[int, int] | None = None
        self._psutil: Any = None
        self._nvml: Any = None
        self._gpus: list[Any] = []
        self._warned: set[str] = set()

    def start(self) -> None:
        self._origin = self.logger.run_start_s or time.time()
        self._last_step = -1
        try:
            import importlib

            self._psutil = importlib.import_module("psutil")
            self._psutil.cpu_percent(interval=None)  # the first call sets its baseline
        except ImportError:
            self._last_cpu = _read_cpu_times()
        self._open_gpus()
        self._thread = threading.Thread(
            target=self._loop, name=f"stoker-system-sampler-{self.node}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling, with one last sample: a run shorter than the
        interval still records its node."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._log_sample()
        if self._nvml is not None:
            with contextlib.suppress(Exception):  # NVMLError: the sampler is done either way
                self._nvml.nvmlShutdown()
            self._nvml = None

    def sample(self) -> dict[str, float]:
        """One reading of every metric this node has (keys as in the class docstring)."""
        prefix = f"system/{self.node}"
        values: dict[str, float] = {}
        cpu = self._cpu_percent()
        if cpu is not None:
            values[f"{prefix}/cpu_percent"] = cpu
        used = self._memory_used()
        if used is not None:
            values[f"{prefix}/memory_gb"] = used / 1e9
        for index, handle in enumerate(self._gpus):
            for name in ("utilization", "memory_gb", "power_w"):
                try:
                    values[f"{prefix}/gpu{index}/{name}"] = self._read_gpu(handle, name)
                except Exception:  # NVMLError_NotSupported (MIG, some boards): skip it
                    self._say_once(f"gpu-{name}", f"GPU {index} gives no {name}: not logged")
        return values

    def _read_gpu(self, handle: Any, name: str) -> float:
        nvml = self._nvml
        if name == "utilization":
            return float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
        if name == "memory_gb":
            return float(nvml.nvmlDeviceGetMemoryInfo(handle).used) / 1e9
        return float(nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0  # milliwatts

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._log_sample()

    def _log_sample(self) -> None:
        step = int(time.time() - self._origin)
        if step <= self._last_step:
            return
        self._last_step = step
        try:
            self.logger.log_metrics(self.sample(), step)
        except Exception as exc:  # a sampler must never stop training
            self._say_once("sample", f"system metrics of {self.node} failed: {exc}")

    def _cpu_percent(self) -> float | None:
        if self._psutil is not None:
            return float(self._psutil.cpu_percent(interval=None))
        now = _read_cpu_times()
        before, self._last_cpu = self._last_cpu, now
        if now is None or before is None or now[1] <= before[1]:
            return None
        return 100.0 * (now[0] - before[0]) / (now[1] - before[1])

    def _memory_used(self) -> int | None:
        if self._psutil is not None:
            memory = self._psutil.virtual_memory()
            return int(memory.total - memory.available)
        return _read_memory_used()

    def _open_gpus(self) -> None:
        import importlib

        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            self._say_once("nvml", "pynvml (nvidia-ml-py) is not installed: no GPU metrics")
            return
        try:
            nvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            if visible is None:
                ids: list[str] = [str(i) for i in range(nvml.nvmlDeviceGetCount())]
            else:
                ids = [part.strip() for part in visible.split(",") if part.strip()]
            for ident in ids:
                if ident.isdigit():
                    self._gpus.append(nvml.nvmlDeviceGetHandleByIndex(int(ident)))
                elif ident.startswith("GPU-"):
                    self._gpus.append(nvml.nvmlDeviceGetHandleByUUID(ident))
                else:  # MIG-... instances have no utilisation counters of their own
                    self._say_once(f"gpu-{ident}", f"no GPU metrics for {ident}")
        except Exception as exc:  # NVMLError: no driver on this node
            self._say_once("nvml", f"NVML is not usable ({exc}): no GPU metrics")
            self._gpus = []
            return
        self._nvml = nvml

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(f"stoker: {message}", file=sys.stderr, flush=True)


def _read_cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all cores from /proc/stat; None off Linux."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(x) for x in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    idle = fields[3] + fields[4]
    total = sum(fields)
    return total - idle, total


def _read_memory_used() -> int | None:
    """MemTotal - MemAvailable from /proc/meminfo, in bytes; None off Linux."""
    values: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(values) < 2:
        return None
    return values["MemTotal"] - values["MemAvailable"]


def ensure_run(
    tracking_uri: str,
    experiment: str,
    run_name: str,
    params: Mapping[str, ParamValue],
    tags: Mapping[str, str],
) -> str:
    """For `stoker run`, which has no run made at submit: create the experiment (if
    missing) and a run, as `stoker submit` does, and return the run's id. The run is
    SCHEDULED until `RunLogger.start()` marks it RUNNING. Raises StokerError naming the
    store when it cannot be reached or refuses."""
    target = resolve_tracking_uri(tracking_uri)
    created = precreate_run(
        target, experiment=experiment, run_name=run_name, params=params, tags=tags, artifacts={}
    )
    return created.run_id
