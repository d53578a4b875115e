"""Part e: sampling and encoding. Seconds per sampling step of the 1b av_dit (its
flow ODE, Euler, on its 2 s 256x256 clip, 4 seeds at once, bf16 autocast as the
trainer samples at evaluation); `stoker data encode`'s throughput where PyAV and
soundfile are present (it decodes packed media), else skipped with the reason."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import torch

from benchmarks.gpu_check.result import PartResult
from stoker.config import resolve_config
from stoker.runtime.models import build_model
from stoker.runtime.sampling.draw import sample_model

SEEDS = (0, 1, 2, 3)


def _importable(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def main(out_dir: Path, *, dry_run: bool) -> None:
    result = PartResult(out_dir, "sample", dry_run=dry_run)
    device = torch.device("cpu" if dry_run else "cuda")
    size = "tiny" if dry_run else "1b"
    overrides = [
        f"model.size={size}",
        "data.resolution=[64,64]" if dry_run else "data.resolution=[256,256]",
        "data.clip_seconds=1.0" if dry_run else "data.clip_seconds=2.0",
    ]
    cfg = resolve_config(None, overrides, use_profile=False).config
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data).to(device)
    precision = torch.bfloat16 if device.type == "cuda" else torch.float32
    for steps in (1, 2) if dry_run else (2, 8):  # the first run warms up (kernels compile)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        with torch.autocast(device.type, dtype=precision, enabled=device.type == "cuda"):
            clips = sample_model(model, seeds=SEEDS, steps=steps, method="euler")
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - began
        row = {
            "what": "av_dit sampling",
            "size": size,
            "seeds": len(SEEDS),
            "steps": steps,
            "method": "euler",
            "seconds": round(seconds, 3),
            "seconds_per_step": round(seconds / steps, 4),
            "shapes": {k: list(v.shape) for k, v in clips.items()},
        }
        result.add_row(row)
        print(row, flush=True)
    last = result.doc["rows"][-1]
    result.set(
        summary={"1b s/step (4 clips)" if not dry_run else "s/step": last["seconds_per_step"]}
    )
    missing = [m for m in ("av", "soundfile") if not _importable(m)]
    if missing:
        result.skip(
            "data encode throughput",
            f"{', '.join(missing)} not installed here: "
            "data encode decodes packed media (H.264 and FLAC) with them",
        )
    else:
        result.skip(
            "data encode throughput",
            "measured by benchmarks/loader_latents.py where "
            "PyAV is present; not part of this check yet",
        )
    result.finish()
