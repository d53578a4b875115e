"""Where the trainer's records go: the `MetricsSink` interface and two small sinks.

The trainer calls nothing on its sink but these five methods; the job's MLflow
logger (the tracking package's `RunLogger`, wrapped per rank by the runtime's
tracking setup) implements them all, with the same signatures. Every call returns
at once and never raises into the loop: a sink queues, it does not send.

    NullSink         drops everything (a trainer built without a sink)
    MetricsOnlySink  keeps numbers only: a committed checkpoint arrives as its
                     `checkpoint/*` metrics at its step; tags, artifacts and models
                     are dropped (recording sinks in tests subclass it)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from stoker.checkpoint.checkpointer import SaveRecord, save_metrics


class MetricsSink(Protocol):
    """What the trainer reports, on global rank 0 (other ranks get sinks that drop it)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """One log step's metrics (Python floats: a GPU tensor here would sync)."""

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set run tags; a tag set again takes the new value (`stoker.slowest_host`)."""

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        """Upload a file into the run's artifacts, under `artifact_path` (profiles)."""

    def log_checkpoint(
        self, step: int, uri: str, *, bytes: int, blocking_s: float, background_s: float
    ) -> None:
        """Checkpoint `step-<step>` has committed at `uri`: `bytes` its size,
        `blocking_s` how long training waited for it, `background_s` the rest of
        the save. Called from the checkpoint thread."""

    def log_final_model(self, local_dir: Path, *, step: int, name: str = "final") -> None:
        """The files of `local_dir` as the run's logged model `name` (checkpoint.upload_final)."""


class NullSink:
    """A sink that drops everything."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        pass

    def set_tags(self, tags: Mapping[str, str]) -> None:
        pass

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        pass

    def log_checkpoint(
        self, step: int, uri: str, *, bytes: int, blocking_s: float, background_s: float
    ) -> None:
        pass

    def log_final_model(self, local_dir: Path, *, step: int, name: str = "final") -> None:
        pass


class MetricsOnlySink(NullSink):
    """A sink that keeps numbers only: subclasses implement `log_metrics`, and a
    committed checkpoint reaches it as its `checkpoint/*` metrics at its step
    (`save_metrics`)."""

    def log_checkpoint(
        self, step: int, uri: str, *, bytes: int, blocking_s: float, background_s: float
    ) -> None:
        record = SaveRecord(step, uri, bytes, blocking_s, background_s)
        self.log_metrics(save_metrics(record), step)
