"""The job's checkpointer from the experiment's `checkpoint.*` keys: one place for the
built-in trainer and `stoker.job`'s `run.checkpointer()` (own_loop/checkpoint.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stoker.checkpoint.checkpointer import Checkpointer, SaveRecord
from stoker.config import ExperimentConfig, state_hash
from stoker.config.frozen import frozen_text
from stoker.protocol import ENV_RESTART
from stoker.runtime.observe.heartbeat import interval_for, silent_ranks

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from stoker.runtime.observe.metrics_sink import MetricsSink


def checkpoint_facts(cfg: ExperimentConfig) -> dict[str, Any]:
    """What COMMIT.json's `extra` says of the run beside its frozen config: the data's
    shapes as the model was built for them (latent shapes come from the data sets'
    manifests, which a reader of the checkpoint may not reach) and the MLflow store of
    the run that saved it (passwords hidden), where `ckpt export --register` registers."""
    import contextlib
    import dataclasses
    import os

    from stoker.redact import hide_url_passwords
    from stoker.runtime.models import data_shapes

    facts: dict[str, Any] = {"model_arch": cfg.model.arch}
    # Where they cannot be had (a manifest not reachable), the config beside them says how.
    with contextlib.suppress(Exception):
        facts["data_shapes"] = dataclasses.asdict(data_shapes(cfg.data))
    store = os.environ.get("MLFLOW_TRACKING_URI")
    if store:
        facts["tracking_uri"] = hide_url_passwords(store)
    return facts


def measured_steps_text(run_dir: Path) -> dict[str, str]:
    """The run's measured-steps.json as it is now, to be carried by a commit; nothing
    before the first log step wrote it."""
    from stoker.checkpoint.commit import MEASURED_NAME

    path = run_dir / MEASURED_NAME
    return {MEASURED_NAME: path.read_text()} if path.is_file() else {}


def checkpointer_for(
    cfg: ExperimentConfig,
    root: str,
    *,
    rank: int,
    world_size: int,
    mesh: DeviceMesh | None,
    sink: MetricsSink | None,
    on_commit: Callable[[int], None] | None = None,
    run_dir: Path | None = None,
) -> Checkpointer:
    """A Checkpointer under `root` as checkpoint.* asks (create it on every rank: a
    collective). `sink`, on global rank 0: each committed save's metrics and logged
    model (`log_checkpoint`), from the checkpoint thread; `on_commit(step)` too, on
    every rank that has a sink. `run_dir`: each commit carries what the run's steps
    measured so far (`stoker plan --calibrate CKPT`), and a rank's wait for a save in
    flight ends (PeerGone) once a watched peer's heartbeat went silent (peers_gone_for)."""
    ckpt = cfg.checkpoint
    layout: dict[str, Any] | None = None
    if mesh is not None:
        layout = {"dims": list(mesh.mesh_dim_names or ()), "shape": list(mesh.shape)}
        if cfg.train.context_parallel > 1:  # a resume may take any degree (elastic)
            layout["context_parallel"] = cfg.train.context_parallel
            layout["context_parallel_ulysses"] = cfg.train.ulysses_degree()

    def report(record: SaveRecord) -> None:
        assert sink is not None
        if on_commit is not None:
            on_commit(record.step)
        sink.log_checkpoint(
            record.step,
            record.url,
            bytes=record.bytes,
            blocking_s=record.blocking_s,
            background_s=record.background_s,
        )

    return Checkpointer(
        root,
        described_by=frozen_text(cfg, f"the run that saved this checkpoint under {root}"),
        facts=checkpoint_facts(cfg),
        carried=(lambda: measured_steps_text(run_dir)) if run_dir is not None else None,
        rank=rank,
        world_size=world_size,
        async_save=ckpt.async_save,
        keep_last=ckpt.keep_last,
        keep_every=ckpt.keep_every,
        mesh=layout,
        state_hash=state_hash(cfg),
        full_verify_on_load=ckpt.verify == "full",
        on_commit=report if sink is not None else None,
        start_fresh_if_none_verifies=ckpt.if_none_verifies == "start_fresh",
        peers_gone=peers_gone_for(cfg, run_dir, rank, world_size),
        peers_poll_s=interval_for(cfg.train.hang_timeout_s),
    )


def peers_gone_for(
    cfg: ExperimentConfig, run_dir: Path | None, rank: int, world_size: int
) -> Callable[[], list[int]] | None:
    """The peers whose heartbeat has been silent for the collective timeout (at least
    three heartbeats), for `rank`'s wait on a save in flight: rank 0 watches every
    other rank, the others watch rank 0 alone (one file each, not the world's on every
    rank); whichever exits 76 first ends the step for the rest. None without heartbeats
    (train.hang_timeout_s 0) or a run folder."""
    train = cfg.train
    if run_dir is None or not train.hang_timeout_s or world_size < 2:
        return None
    restart = int(os.environ.get(ENV_RESTART) or 0)
    silent_s = max(train.collective_timeout_s, 3 * interval_for(train.hang_timeout_s))
    watched = list(range(1, world_size)) if rank == 0 else [0]

    def gone() -> list[int]:
        return silent_ranks(run_dir, restart, world_size, silent_s, among=watched)

    return gone
