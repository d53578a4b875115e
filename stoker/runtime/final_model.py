"""What becomes of the final weights at the end of a run, on global rank 0:

- checkpoint.upload_final: consolidated into one safetensors file, uploaded to MLflow
  as the run's logged model `final`;
- train.register_final: NAME: exported (the EMA's weights where train.ema_decay kept
  them) and registered as the next version of NAME in MLflow's model registry, with
  the lineage as tags (stoker.tracking.model_registry): the run, the checkpoint's
  COMMIT.json digest, the data sets' digests, the samples of that step.

A registry that cannot be reached costs the version, not the run: the weights are in
the checkpoint, and `stoker ckpt export CKPT OUT --register NAME` registers them later.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

from stoker.config import ExperimentConfig
from stoker.errors import StokerError
from stoker.runtime.observe.metrics_sink import MetricsSink


def upload_final(checkpoint_url: str, run_dir: Path, sink: MetricsSink, step: int) -> None:
    """checkpoint.upload_final: the weights of `checkpoint_url` as the logged model `final`."""
    from stoker.checkpoint.export import export_weights

    folder = run_dir / "final-model"
    result = export_weights(checkpoint_url, str(folder / "model.safetensors"), force=True)
    print(f"final weights: {result.out} ({result.bytes} bytes)", flush=True)
    sink.log_final_model(folder, step=step)


def register_final(
    cfg: ExperimentConfig,
    checkpoint_url: str,
    run_dir: Path,
    *,
    run_id: str | None,
    ema: bool,
    samples_logged: bool,
) -> int | None:
    """train.register_final: the version registered, or None (with a warning) when the
    registry refused or could not be reached. `samples_logged`: the run's samples of
    this step are on their way to samples/step-<N> (the upload queue may not have sent
    them yet, so the tag is set from what the run logged, not from what MLflow lists)."""
    from stoker.checkpoint.export import export_weights
    from stoker.checkpoint.origin import read_origin
    from stoker.tracking.model_registry import SAMPLES_TAG, WEIGHTS_TAG, register_version

    name = cfg.train.register_final
    assert name is not None
    weights: Literal["ema", "model"] = "ema" if ema else "model"
    out = run_dir / "registered-model" / "model.safetensors"
    export_weights(checkpoint_url, str(out), force=True, weights=weights)
    origin = read_origin(checkpoint_url)
    tags: dict[str, str] = {WEIGHTS_TAG: weights}
    if samples_logged and run_id:
        tags[SAMPLES_TAG] = f"runs:/{run_id}/samples/step-{origin.step}"
    try:
        version = register_version(
            name,
            out,
            checkpoint_url=origin.folder,
            step=origin.step,
            run_id=run_id,
            commit_sha256=origin.commit_sha256,
            tracking_uri=cfg.tracking.uri,
            extra_tags=tags,
        )
    except StokerError as exc:
        print(
            f"warning: train.register_final: {name!r} was not registered: {exc}; "
            f"register it later with `stoker ckpt export {origin.folder} model.safetensors "
            f"--register {name}`",
            file=sys.stderr,
            flush=True,
        )
        return None
    print(
        f"registered {name} version {version.version} ({weights} weights of step-{origin.step})",
        flush=True,
    )
    return version.version
