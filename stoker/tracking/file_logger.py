"""`FileRunLogger`: the job's records in a file of its run folder instead of MLflow, for
`tracking.uri: none` (a machine without mlflow, or without a store to reach).

    logger = FileRunLogger(run_dir / "metrics.jsonl", run_id=job_id)
    logger.start()                        # learns the steps an earlier attempt wrote
    logger.log_metrics({"loss": 2.3}, step=10)
    logger.close("FINISHED")              # or close(None) before a requeue

It takes RunLogger's calls (stoker/tracking/logger.py), with the same signatures and
name checks, and writes each as one line in the spool's record format
(stoker/tracking/spool.py), so `Spool(path, run_id).records()` reads the file back:

    {"run": id, "m": [[key, value, ms, step], ...]}        metrics
    {"run": id, "p": {...}}, {"run": id, "t": {...}}       params, tags
    {"run": id, "a": [local_path, artifact_path]}          an artifact: its path (the
                                                           file stays where it is)
    {"run": id, "lm": {"name", "step", ..., "dir"}}         a checkpoint (its URI) or
                                                           the final weights' folder
    {"run": id, "ds": [...]}                               the data sets read
    {"run": id, "status": "FINISHED"}                      the end (close with a status)

The step rule holds as in MLflow: a point at or below a step the file already has for
its key is dropped, so a requeued job's repeated steps appear once. Nothing here
imports mlflow.

Each call writes and flushes one line under a lock (the trainer, the checkpoint
thread, the samples thread and the system sampler share the logger) and returns;
the file is fsync'd at close. A write that fails is said on stderr once, never
raised: training goes on.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from stoker.errors import StokerError
from stoker.metric_names import checkpoint_metrics
from stoker.tracking.dataset_inputs import DataSetInput, dataset_entry
from stoker.tracking.limits import (
    MAX_PARAM_VALUE,
    MAX_TAG_VALUE,
    ParamValue,
    check_key,
    check_model_name,
    cut,
)
from stoker.tracking.logged_models import checkpoint_model, folder_model
from stoker.tracking.logger import Status
from stoker.tracking.spool import Record, Spool
from stoker.tracking.stderr import first_line, warn

METRICS_FILE = "metrics.jsonl"
"""The file's name in the run folder (global rank 0 writes it)."""


class FileRunLogger:
    """RunLogger's calls, written to `path`; see the module docstring."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = Path(path).absolute()
        self.run_id = run_id
        self._lock = threading.Lock()
        self._handle: IO[str] | None = None
        self._highest: dict[str, int] = {}
        self._valid_keys: set[str] = set()
        self._failed = False
        self._run_start_s: float | None = None
        self.written = 0
        """Metric points written."""
        self.dropped = 0
        """Metric points at or below a step the file had for their key."""

    @property
    def run_start_s(self) -> float | None:
        """When the run started (epoch seconds): the first point an earlier attempt
        wrote, else this start; None before `start()`. The system sampler's origin."""
        return self._run_start_s

    def start(self) -> None:
        """Learn the highest step of each key and the run's start from what an earlier
        attempt wrote, and open the file for appending. StokerError if it cannot be
        read or opened (a run folder that is not writable)."""
        if self._handle is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a")
        except OSError as exc:
            raise StokerError(
                f"cannot write the run's metrics file {self.path}: {exc}",
                fix="make the run folder writable (tracking.uri is none: the metrics go there)",
            ) from exc
        first_ms: int | None = None
        with self._lock:
            try:
                for record in Spool(self.path, self.run_id).records():
                    for key, _value, ms, step in record.get("m", ()):
                        if step > self._highest.get(key, -1):
                            self._highest[key] = int(step)
                        first_ms = ms if first_ms is None else min(first_ms, ms)
            except BaseException:
                handle.close()
                raise
            self._run_start_s = first_ms / 1000 if first_ms is not None else time.time()
            self._handle = handle

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Write one step's values (NaN and inf included; a key's step at or below one
        it has is dropped). Pass Python floats: `float()` of a GPU tensor would wait."""
        self._log_points(metrics, int(step))

    def _log_points(self, metrics: Mapping[str, float], step: int) -> list[list[Any]]:
        """The points of `metrics` the step rule lets through, written."""
        for key in metrics:
            if key not in self._valid_keys:
                check_key("metric", key)
                self._valid_keys.add(key)
        stamp = int(time.time() * 1000)
        with self._lock:
            points: list[list[Any]] = []
            for key, value in metrics.items():
                if step <= self._highest.get(key, -1):
                    self.dropped += 1
                    continue
                self._highest[key] = step
                points.append([key, float(value), stamp, step])
            if points:
                self._write({"run": self.run_id, "m": points})
                self.written += len(points)
        return points

    def log_params(self, params: Mapping[str, ParamValue]) -> None:
        """Write params, values cut to MLflow's 6000 characters."""
        prepared = {}
        for key, value in params.items():
            check_key("param", key)
            prepared[key] = cut(str(value), MAX_PARAM_VALUE)
        self._put({"run": self.run_id, "p": prepared})

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Write tags (a later line's value wins), values cut to 8000 characters."""
        prepared = {}
        for key, value in tags.items():
            check_key("tag", key)
            prepared[key] = cut(str(value), MAX_TAG_VALUE)
        self._put({"run": self.run_id, "t": prepared})

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        """Write where the file or folder is (nothing is copied). Never raises."""
        self._put({"run": self.run_id, "a": [str(Path(local_path).absolute()), artifact_path]})

    def log_checkpoint(
        self, step: int, uri: str, *, bytes: int, blocking_s: float, background_s: float
    ) -> None:
        """The `system/checkpoint/*` metrics at `step` and the checkpoint's record (its
        URI), as RunLogger.log_checkpoint logs them. Never raises."""
        try:
            step = int(step)
            values = checkpoint_metrics(int(bytes), blocking_s, background_s)
            points = self._log_points(values, step)  # the model's metrics: those written
            self._put({"run": self.run_id, "lm": checkpoint_model(step, uri, int(bytes), points)})
        except Exception as exc:  # a record must never stop training
            warn(f"checkpoint step-{step} is not recorded in {self.path}: {first_line(exc)}")

    def log_final_model(self, local_dir: Path, *, step: int, name: str = "final") -> None:
        """Write the record of model `name`, the files of `local_dir` (left in place).
        Raises StokerError for a name MLflow would refuse; nothing else."""
        check_model_name(name)
        self._put({"run": self.run_id, "lm": folder_model(local_dir, step=step, name=name)})

    def log_dataset_inputs(self, inputs: Sequence[DataSetInput]) -> None:
        """Write the data sets the run reads. Never raises."""
        try:
            entries = [dataset_entry(data_set) for data_set in inputs]
        except Exception as exc:  # a record must never stop training
            warn(f"the run's data sets are not recorded in {self.path}: {first_line(exc)}")
            return
        if entries:
            self._put({"run": self.run_id, "ds": entries})

    def close(self, status: Status | None) -> None:
        """Write the final status (unless None: a job about to be requeued), fsync and
        close the file."""
        with self._lock:
            if status is not None:
                self._write({"run": self.run_id, "status": status})
            handle, self._handle = self._handle, None
            if handle is None:
                return
            try:
                handle.flush()
                os.fsync(handle.fileno())
                handle.close()
            except OSError as exc:
                self._warn(exc)

    def _put(self, record: Record) -> None:
        with self._lock:
            self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        """One line, flushed; the caller holds the lock."""
        if self._handle is None:
            if not self._failed:
                self._failed = True
                warn(
                    f"{self.path} is not open (start() first, or after close()): "
                    "records are dropped"
                )
            return
        try:
            self._handle.write(json.dumps(record, separators=(",", ":")) + "\n")
            self._handle.flush()
        except (OSError, TypeError, ValueError) as exc:
            self._warn(exc)

    def _warn(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            warn(
                f"cannot write the run's metrics file {self.path}: {first_line(exc)}; "
                "later records may be lost"
            )
