"""The writer thread of a RunLogger: sends what the queue holds, rides out a store outage.

Every `flush_interval_s`, or as soon as the queue wakes it, the thread packs the
queued records into store calls (stoker/tracking/packing.py) and sends them.

When the store does not answer (connection refused, HTTP 5xx, sqlite locked...)
training goes on: the batch that failed and every later one are appended to the
spool (stoker/tracking/spool.py), the thread retries with exponential backoff up to
`retry_max_s`, and when the store answers it replays the spool in order, truncates
it and goes on. A job killed meanwhile leaves the spool behind; the next attempt's
connect replays it. Each connect (at start and after an outage) reads the run's
highest step per key and its params, for the step rule.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any, cast

from stoker.errors import StokerError
from stoker.tracking.dataset_inputs import send_dataset_inputs
from stoker.tracking.logged_models import send_model
from stoker.tracking.packing import Batch, Packer
from stoker.tracking.record_queue import RecordQueue
from stoker.tracking.spool import Spool
from stoker.tracking.stderr import first_line, say, warn

# First wait after a failed call; it doubles up to retry_max_s.
FIRST_RETRY_S = 0.5
# Extra seconds close() waits for a store call already under way.
CLOSE_GRACE_S = 1.0


class StoreDown(Exception):
    """A store call failed in a way that may pass: keep the data, retry later."""


def is_transient(exc: Exception) -> bool:
    """True where waiting may help: no answer, 5xx, 408, 429, a locked or busy store."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        # A refused connection and exhausted HTTP retries arrive as INTERNAL_ERROR (500).
        code = int(cast(Any, exc).get_http_status_code())  # untyped in mlflow
        return code >= 500 or code in (408, 429)
    # Our own bugs would fail the same way forever; SQLAlchemy and requests errors pass.
    return not isinstance(exc, (TypeError, ValueError, AttributeError, KeyError))


class StoreWriter:
    """Sends the records of `queue` into run `run_id` of the store at `tracking_uri`
    from a background thread; spools them through an outage. Counters are read by
    `RunLogger.stats()`."""

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        queue: RecordQueue,
        spool: Spool,
        *,
        flush_interval_s: float,
        batch_points: int,
        retry_max_s: float,
    ) -> None:
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.flush_interval_s = flush_interval_s
        self.retry_max_s = max(retry_max_s, FIRST_RETRY_S)
        self.run_start_s: float | None = None
        """The run's start time (epoch seconds) as the store said; None until it did."""
        self.packer = Packer(run_id, batch_points)
        self._queue = queue
        self._spool = spool

        # The thread's state; close() touches it only under _spool_lock, after the
        # thread failed to stop in time.
        self._spool_lock = threading.Lock()
        self._inflight: list[Batch] = []
        self._abandoned = False
        self._client: Any = None
        self._experiment_id: str | None = None
        self._connected = False
        self._marked_running = False
        self._in_outage = False
        self._backoff = FIRST_RETRY_S
        self._next_try = 0.0
        self._warned_errors: set[str] = set()
        self.in_hand = 0
        """Metric points taken from the queue, neither in the store nor spooled yet."""
        self.sent = 0
        self.refused = 0
        """Points the store refused (dropped)."""
        self.models = 0
        self.datasets = 0
        self.outages = 0

        self._closing = threading.Event()
        self._deadline = math.inf
        self._final_status: str | None = None
        self._status_set = False
        self._thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        """Start the thread (after `connect(at_start=True)`)."""
        self._thread = threading.Thread(target=self._run, name="stoker-run-logger", daemon=True)
        self._thread.start()

    def close(self, status: str | None, timeout_s: float) -> None:
        """Send what can be sent within `timeout_s`, then set the run's status unless it
        is None; spool what is left (the queue is closed already) and say so."""
        if self._thread is None:  # never started: keep what was logged for a later start()
            with self._spool_lock:
                self._abandoned = True
                records, _ = self._queue.take()
                self._spool.append(list(records))
            self.in_hand = 0
            self._report_leftovers(status)
            return
        self._final_status = status
        self._deadline = time.monotonic() + timeout_s
        self._closing.set()
        self._queue.wake.set()
        self._thread.join(timeout_s + CLOSE_GRACE_S)
        # Nothing is left in hand unless the thread is stuck in a store call or died:
        # keep that in the spool (the next start() drops what the stuck call may still
        # manage to send).
        with self._spool_lock:
            self._abandoned = True
            queued, _ = self._queue.take()
            self._spool.append([b.record(self.run_id) for b in self._inflight] + list(queued))
            self._inflight = []
        self._report_leftovers(status)

    # --- the thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._work()
        except Exception as exc:  # a bug here must not end training
            warn(
                f"the MLflow writer of run {self.run_id} stopped: {type(exc).__name__}: "
                f"{first_line(exc)}; what is logged from now on is written to "
                f"{self._spool.path} at close()"
            )

    def _work(self) -> None:
        while True:
            now = time.monotonic()
            timeout = self.flush_interval_s
            if not self._connected:
                timeout = min(timeout, max(0.0, self._next_try - now))
            if self._closing.is_set():
                timeout = 0.0 if self._connected else min(timeout, max(0.0, self._deadline - now))
            self._queue.wake.wait(timeout)
            self._queue.wake.clear()
            closing = self._closing.is_set()
            if not self._connected and time.monotonic() >= self._next_try:
                self.connect(at_start=False)
            with self._spool_lock:
                if self._abandoned:
                    return
                records, points = self._queue.take()
                self.in_hand += points
                self._inflight = list(self.packer.pack(records))
                self.in_hand = sum(b.points for b in self._inflight)
            if self._connected:
                self._deliver()
            elif not self._spool_inflight():
                return
            self.in_hand = 0
            if closing and (
                (self._connected and not self._queue.waiting) or time.monotonic() >= self._deadline
            ):
                break
        if self._connected and self._final_status is not None and not self._abandoned:
            try:
                self._client.set_terminated(self.run_id, status=self._final_status)
                self._status_set = True
            except Exception as exc:
                warn(
                    f"could not set run {self.run_id} to {self._final_status} in MLflow store "
                    f"{self.tracking_uri}: {first_line(exc)}"
                )

    def connect(self, *, at_start: bool) -> None:
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
            self.packer.learn(maxes, params)
            replayed = self._replay()
        except StokerError as exc:
            if at_start:
                raise
            self._outage(exc)
            return
        except StoreDown as exc:
            self._outage(exc)
            return
        except Exception as exc:
            if at_start and not is_transient(exc):
                raise StokerError(
                    f"MLflow store {self.tracking_uri}: cannot log into run {self.run_id}: "
                    f"{first_line(exc)}",
                    fix="check MLFLOW_RUN_ID and the tracking URI the job was given",
                ) from exc
            self._outage(exc)
            return
        self._connected = True
        self._backoff = FIRST_RETRY_S
        if self._in_outage:
            self._in_outage = False
            say(
                f"MLflow store {self.tracking_uri} answers again: replayed "
                f"{replayed} points from {self._spool.path}"
            )
        elif replayed:
            say(
                f"replayed {replayed} points an earlier attempt left in "
                f"{self._spool.path} into run {self.run_id}"
            )

    def _outage(self, exc: Exception) -> None:
        self._connected = False
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.retry_max_s)
        if not self._in_outage:
            self._in_outage = True
            self.outages += 1
            cause = exc.__cause__ if isinstance(exc, StoreDown) and exc.__cause__ else exc
            warn(
                f"MLflow store {self.tracking_uri} does not answer ({first_line(cause)}); "
                f"training goes on, and metrics wait in {self._spool.path} until it does "
                f"(retrying every {self.retry_max_s:g} s at most)"
            )

    def _replay(self) -> int:
        """Send the spool in order, then truncate it. Raises StoreDown (the spool is
        kept whole: the next try drops what this one sent)."""
        path = self._spool.path
        if not path.exists() or path.stat().st_size == 0:
            return 0
        replayed = 0
        for batch in self.packer.pack(self._spool.records()):
            if self._closing.is_set() and time.monotonic() >= self._deadline:
                raise StoreDown("close() timed out during the replay")
            self._send(batch)
            replayed += batch.points
        with self._spool_lock:
            if not self._abandoned:
                self._spool.clear()
        return replayed

    def _deliver(self) -> None:
        """Send the batches in hand; at the first failure that may pass, spool them all."""
        while self._inflight:
            batch = self._inflight[0]
            try:
                self._send(batch)
            except StoreDown as exc:
                if self._spool_inflight():
                    self._outage(exc)
                return
            with self._spool_lock:
                if self._abandoned:
                    return
                self._inflight.pop(0)
                self.in_hand -= batch.points

    def _spool_inflight(self) -> bool:
        """Append the batches in hand to the spool; False if close() gave up on this
        thread (it spooled them itself)."""
        with self._spool_lock:
            if self._abandoned:
                return False
            self._spool.append([b.record(self.run_id) for b in self._inflight])
            self.in_hand -= sum(b.points for b in self._inflight)
            self._inflight = []
        return True

    def _send(self, batch: Batch) -> None:
        """One store call. Raises StoreDown where retrying may help; drops the batch
        with a warning (once per kind of error) where the store refused it."""
        try:
            if batch.model is not None:
                local = batch.model.get("dir")
                if local is not None and not Path(local).is_dir():
                    self._refused(batch, f"folder {local} no longer exists")
                    return
                if send_model(self._client, self.run_id, self._experiment_id, batch.model):
                    self.models += 1
                return
            if batch.datasets is not None:
                self.datasets += send_dataset_inputs(self._client, self.run_id, batch.datasets)
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
            if is_transient(exc):
                raise StoreDown(first_line(exc)) from exc
            self._refused(batch, first_line(exc))
            return
        self.sent += batch.points

    def _refused(self, batch: Batch, reason: str) -> None:
        self.refused += batch.points
        kind = reason[:80]
        if kind not in self._warned_errors:
            self._warned_errors.add(kind)
            if batch.model is not None:
                what = f"logged model {batch.model['name']!r}"
            elif batch.artifact is not None:
                what = f"artifact {batch.artifact[0]}"
            elif batch.datasets is not None:
                names = ", ".join(str(d["name"]) for d in batch.datasets)
                what = f"dataset inputs {names}"
            else:
                what = f"{batch.points} points, {len(batch.params)} params, {len(batch.tags)} tags"
            warn(
                f"MLflow store {self.tracking_uri} refused {what} for run {self.run_id}: "
                f"{reason}; dropped (later errors like this one are not reported)"
            )

    def _report_leftovers(self, status: str | None) -> None:
        left = self._spool.points + self._queue.waiting
        if left or self._spool.has_data():
            wanted = f"; run {self.run_id} stays RUNNING, not {status}" if status else ""
            warn(
                f"MLflow store {self.tracking_uri} did not take everything before close(): "
                f"{left} points stay in {self._spool.path}, and the next start() of a "
                f"RunLogger on this run and spool sends them{wanted}"
            )
        elif status is not None and not self._status_set:
            warn(f"run {self.run_id} stays RUNNING, not {status}")
