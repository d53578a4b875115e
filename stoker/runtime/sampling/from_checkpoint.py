"""Samples from a checkpoint in one process (`stoker sample`): the checkpoint's model
rebuilt from its run's config, its weights read whole whatever the world size that
saved them (stoker.checkpoint.export.read_weights: DCP reshards the FSDP2 shards),
the EMA's weights by default where the run kept one, then sample_model and
sample_files.write_samples into a folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from stoker.checkpoint.export import EMA_PREFIX, read_weights, verified_folder
from stoker.checkpoint.storage import storage_reader
from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.runtime.dist.precision import resolve_precision
from stoker.runtime.sampling.draw import sample_model
from stoker.runtime.sampling.files import write_samples
from stoker.runtime.sampling.flow import FlowMethod, OnStep

WeightsChoice = Literal["auto", "ema", "model"]


@dataclass(frozen=True)
class CheckpointSamples:
    step: int
    checkpoint: str
    """The step-<N> folder the weights came from."""
    weights: Literal["ema", "model"]
    out: Path
    files: list[Path] = field(default_factory=list)


def has_ema(folder_url: str) -> bool:
    """Whether the checkpoint folder holds EMA weights (its metadata alone is read)."""
    entries = storage_reader(folder_url, None).read_metadata().state_dict_metadata
    return any(key.startswith(EMA_PREFIX) for key in entries)


def sample_checkpoint(
    cfg: ExperimentConfig,
    checkpoint_url: str,
    out: Path,
    *,
    seeds: Sequence[int],
    steps: int,
    method: FlowMethod = "heun",
    weights: WeightsChoice = "auto",
    device: torch.device | None = None,
    on_step: OnStep | None = None,
    prompts: Sequence[str] | None = None,
    guidance: float = 1.0,
) -> CheckpointSamples:
    """One sample per seed from the checkpoint at `checkpoint_url` (a step-<N> folder,
    or a root: its newest that verifies) into the folder `out` (replaced whole).
    `cfg` is the experiment that trained it (its model and data keys build the
    model); `weights` "auto" takes the EMA's where the checkpoint has them.
    `prompts`, `guidance`: a conditioned model's (sampling.sample_model)."""
    commit, folder = verified_folder(
        checkpoint_url, full=False, fs_options=None, warn=lambda message: None
    )
    ema = has_ema(folder)
    if weights == "ema" and not ema:
        raise StokerError(
            f"checkpoint {folder!r} has no EMA weights: its run trained without train.ema_decay",
            fix="sample the trained weights (--weights model)",
        )
    chosen: Literal["ema", "model"] = "ema" if ema and weights != "model" else "model"
    from stoker.runtime.models import build_model

    torch.manual_seed(cfg.train.seed)
    model = build_model(cfg.model, cfg.data)
    try:
        model.load_state_dict(read_weights(folder, None, chosen), strict=True)
    except RuntimeError as exc:
        raise StokerError(
            f"the weights of {folder!r} do not fit the model of this config "
            f"({cfg.model.arch}, size {cfg.model.size}): {str(exc).splitlines()[0]}",
            fix="pass the config of the run that saved the checkpoint (--config, or its "
            "run folder's config.yaml)",
        ) from None
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    precision = resolve_precision(cfg.train.precision, device)
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16)
        if precision.value == "bf16" and precision.warning is None
        else nullcontext()
    )
    with autocast:
        samples = sample_model(
            model,
            seeds=seeds,
            steps=steps,
            method=method,
            on_step=on_step,
            prompts=prompts,
            guidance=guidance,
        )
    about: dict[str, object] = {
        "step": commit.step,
        "checkpoint": folder,
        "weights": chosen,
        "method": method,
        "steps": steps,
    }
    if prompts is not None:
        about.update(prompts=list(prompts), guidance=guidance)
    files = write_samples(
        samples, seeds, out, fps=cfg.data.fps, sample_rate=cfg.data.sample_rate, about=about
    )
    return CheckpointSamples(commit.step, folder, chosen, Path(out), files)
