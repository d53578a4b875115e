"""Which MLflow run this job writes, and which rank writes what.

Global rank 0 logs metrics into the run `stoker submit` pre-created
(MLFLOW_RUN_ID), or, started without one (torchrun by hand), into a run it
creates with `precreate_run`, as `stoker submit` does. The store is tracking.uri,
else MLFLOW_TRACKING_URI, else the embedded sqlite default
(stoker/tracking/store.py). Local rank 0 of every node samples that node's CPU,
memory and GPUs into the same run. Other ranks write nothing.

If the store cannot be reached at start, training goes on: metrics are spooled
in the run folder (mlflow-spool-<rank>.jsonl) and replayed when it answers.

With `tracking.uri: none` there is no store and no MLflow run: global rank 0 writes
everything it would log, its node's system metrics included, to
<run folder>/metrics.jsonl (`FileRunLogger`); other ranks and nodes write nothing,
and mlflow is never imported.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from stoker.config import ExperimentConfig
from stoker.protocol import ENV_JOB_ID
from stoker.runtime.dist.dist_env import DistEnv
from stoker.runtime.observe.metrics_sink import NullSink
from stoker.tracking.dataset_inputs import DataSetInput
from stoker.tracking.file_logger import METRICS_FILE, FileRunLogger
from stoker.tracking.logger import RunLogger, Status
from stoker.tracking.runs import config_params, precreate_run
from stoker.tracking.store import resolve_tracking_uri, tracking_off
from stoker.tracking.system_metrics import SystemSampler

# What the trainer's outcome sets the run to; anything else (REQUEUE) leaves it RUNNING.
_RUN_STATUS: dict[str, Status] = {"FINISHED": "FINISHED", "FAILED": "FAILED", "KILLED": "KILLED"}


class SystemOnly(NullSink):
    """Another node's RunLogger, written only by its SystemSampler: the trainer's
    records come from global rank 0 alone (dropped here), and only global rank 0 ends
    the run."""

    def __init__(self, logger: RunLogger) -> None:
        self._logger = logger

    def close(self, status: Status | None) -> None:
        self._logger.close(None)


class Tracking:
    """The trainer's metrics sink (stoker/runtime/observe/metrics_sink.py): a RunLogger (or with
    tracking.uri none a FileRunLogger) on global rank 0, a `SystemOnly` on other nodes'
    local rank 0, nothing elsewhere."""

    def __init__(
        self,
        logger: RunLogger | FileRunLogger | SystemOnly | None,
        sampler: SystemSampler | None,
        run_id: str | None,
    ) -> None:
        self.logger, self.sampler, self.run_id = logger, sampler, run_id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        if self.logger is not None:
            self.logger.log_metrics(metrics, step)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        if self.logger is not None:
            self.logger.set_tags(tags)

    def log_artifact(self, local_path: Path, artifact_path: str | None = None) -> None:
        if self.logger is not None:
            self.logger.log_artifact(local_path, artifact_path)

    def log_checkpoint(
        self, step: int, uri: str, *, bytes: int, blocking_s: float, background_s: float
    ) -> None:
        """Checkpoint `step-<step>` is committed at `uri`: its metrics and an external
        logged model (RunLogger.log_checkpoint). Never raises."""
        if self.logger is not None:
            self.logger.log_checkpoint(
                step, uri, bytes=bytes, blocking_s=blocking_s, background_s=background_s
            )

    def log_final_model(self, local_dir: Path, *, step: int, name: str = "final") -> None:
        """A logged model whose artifacts are the files of `local_dir`, uploaded in the
        background (RunLogger.log_final_model)."""
        if self.logger is not None:
            self.logger.log_final_model(local_dir, step=step, name=name)

    def log_dataset_inputs(self, inputs: Sequence[DataSetInput]) -> None:
        """The data sets the run reads, as its MLflow dataset inputs, from global rank 0
        (stoker/runtime/observe/data_lineage.py); other ranks and nodes drop them."""
        if isinstance(self.logger, (RunLogger, FileRunLogger)):
            self.logger.log_dataset_inputs(inputs)

    def close(self, status: str | None) -> None:
        """`status`: the trainer's outcome (FINISHED, FAILED, KILLED); None or REQUEUE:
        the job exits to be requeued and the run stays RUNNING."""
        if self.sampler is not None:
            self.sampler.stop()
        if self.logger is not None:
            self.logger.close(_RUN_STATUS.get(status or ""))


def _tags(env: DistEnv, device: torch.device) -> dict[str, str]:
    tags = {
        "stoker.world_size": str(env.world_size),
        "stoker.nodes": str(env.num_nodes),
        "stoker.device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "stoker.torch": torch.__version__,
    }
    for name, value in os.environ.items():
        if name in (
            "SLURM_JOB_ID",
            "SLURM_JOB_NAME",
            "SLURM_JOB_PARTITION",
            "SLURM_JOB_NODELIST",
            "SLURM_RESTART_COUNT",
            "SLURM_CLUSTER_NAME",
            "SLURM_JOB_ACCOUNT",
        ):
            tags["slurm." + name.removeprefix("SLURM_").lower()] = value
    return tags


def open_tracking(
    cfg: ExperimentConfig, env: DistEnv, device: torch.device, run_dir: Path, config_path: Path
) -> Tracking:
    """This rank's sink, its RunLogger started (raises StokerError for a run that does
    not exist or a store that refuses a run made here; a store down is no error)."""
    if tracking_off(cfg.tracking.uri):
        return _file_tracking(env, device, run_dir)
    if not (env.is_main or env.is_node_main):
        return Tracking(None, None, os.environ.get("MLFLOW_RUN_ID"))
    from stoker.config import resolve_config

    target = resolve_tracking_uri(cfg.tracking.uri)
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if not run_id:
        if not env.is_main:
            return Tracking(None, None, None)
        run_id = precreate_run(
            target,
            experiment=cfg.tracking.experiment,
            run_name=cfg.tracking.run_name or cfg.job.name,
            params=config_params(resolve_config(config_path, use_profile=False)),
            tags=dict(cfg.tracking.tags),
            artifacts={},
        ).run_id
    logger = RunLogger(target.uri, run_id, run_dir / f"mlflow-spool-{env.rank}.jsonl")
    logger.start()
    if env.is_main:
        logger.set_tags(_tags(env, device))
    # SLURMD_NODENAME: the node as SLURM names it (several slurmd may share a host).
    sampler = SystemSampler(logger, node=os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    sampler.start()
    if not env.is_main:
        # Other nodes' local rank 0: system metrics only.
        return Tracking(SystemOnly(logger), sampler, run_id)
    print(f"MLflow run {run_id} in {target.uri}", file=sys.stderr, flush=True)
    return Tracking(logger, sampler, run_id)


def _file_tracking(env: DistEnv, device: torch.device, run_dir: Path) -> Tracking:
    """tracking.uri none: global rank 0 writes <run folder>/metrics.jsonl, with its
    node's system metrics; no MLflow run (run_id None), nothing on other ranks."""
    if not env.is_main:
        return Tracking(None, None, None)
    # The job id names the records: a requeued job (same id) continues the same run.
    logger = FileRunLogger(run_dir / METRICS_FILE, os.environ.get(ENV_JOB_ID) or "local")
    logger.start()
    logger.set_tags(_tags(env, device))
    sampler = SystemSampler(logger, node=os.environ.get("SLURMD_NODENAME") or socket.gethostname())
    sampler.start()
    print(
        f"tracking.uri is none: metrics to {logger.path} (no MLflow)", file=sys.stderr, flush=True
    )
    return Tracking(logger, sampler, None)
