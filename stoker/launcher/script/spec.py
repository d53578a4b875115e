"""What one submission launches: the resolved experiment plus where and how it runs."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stoker.config import ExperimentConfig, ResolvedConfig


@dataclass(frozen=True)
class LaunchSpec:
    """Everything the renderer needs; built by `submit`, `sweep` and the local backend."""

    resolved: ResolvedConfig
    run_dir: Path
    # argv run in every task (items may be render.Shell for "$STOKER_CONFIG")
    command: Sequence[str]
    workdir: Path
    tracking_uri: str
    """The MLflow store the job logs into; "" for tracking.uri none (no MLflow)."""
    mlflow_run_ids: Sequence[str]
    """Each task's MLflow run; "" each for tracking.uri none."""
    parent_run_id: str | None = None
    array_size: int | None = None
    max_parallel: int | None = None
    after: str | None = None
    extra_sources: dict[str, str] = field(default_factory=dict)
    # The Python with stoker that the batch script ends the MLflow run with (the login
    # node's; a cluster shares it, like the run folder). Missing on the node: not ended there.
    stoker_python: str = field(default_factory=lambda: sys.executable)

    @property
    def config(self) -> ExperimentConfig:
        return self.resolved.config

    @property
    def grace_seconds(self) -> int:
        return self.config.job.stop_grace

    @property
    def experiment_dir(self) -> Path | None:
        exp = self.resolved.experiment
        return exp.resolve().parent if exp is not None else None

    def source_of(self, dotted_key: str) -> str:
        """Where a config value came from, as `--explain` prints it."""
        if dotted_key in self.extra_sources:
            return self.extra_sources[dotted_key]
        return str(self.resolved.source_of(tuple(dotted_key.split("."))))
