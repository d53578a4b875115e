"""Part g, the rest of part c: the 1b audio_ar's step (batch 2 of 8192 tokens, with
stoker's kernels and without), and the av_dit on a batch of latents (the synthetic
latent set of `data.url: null`, `data.modalities: [latent]`)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.result import PartResult
from benchmarks.gpu_check.step_part import run_steps
from stoker.config import resolve_config
from stoker.planning.trace import random_batch, train_step
from stoker.runtime.models import build_model
from stoker.runtime.optim import build_optimizer


def latent_step(result: PartResult, *, dry_run: bool) -> None:
    device = torch.device("cpu" if dry_run else "cuda")
    size, rows = ("tiny", 2) if dry_run else ("1b", 8)
    cfg = resolve_config(
        None,
        [
            f"model.size={size}",
            "data.modalities=[latent]",
            f"data.batch_size={rows}",
            f"train.precision={'fp32' if dry_run else 'bf16'}",
        ],
        use_profile=False,
    ).config
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.data).to(device)
    optimizer = build_optimizer(model, cfg.optim, device)
    params = [p for p in model.parameters() if p.requires_grad]
    batch = random_batch(cfg, rows, device)
    times = []
    for step in range(3 if dry_run else 6):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        began = time.perf_counter()
        train_step(model, optimizer, [batch], params, cfg.optim.grad_clip, not dry_run)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if step:
            times.append(time.perf_counter() - began)
    shapes = {k: list(v.shape) for k, v in batch["latent"].items()} if "latent" in batch else {}
    row: dict[str, Any] = {
        "arch": "av_dit",
        "setup": "latent",
        "size": size,
        "batch_size": rows,
        "latent_shapes": shapes,
        "step_ms": round(1e3 * statistics.median(times), 3),
    }
    if device.type == "cuda":
        row["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
    result.add_row(row)
    print(f"latent: {row}", flush=True)


def main(out_dir: Path, *, dry_run: bool) -> None:
    result = PartResult(out_dir, "more_steps", dry_run=dry_run)
    variants = ("stoker",) if dry_run else ("stoker", "reference")
    rows = run_steps(
        result,
        "audio_ar",
        dry_run=dry_run,
        variants=variants,
        batch_size=2,
        label="audio_ar",
        steps=2 if dry_run else 6,
        warmup=1 if dry_run else 2,
        checkpointing="none",
    )
    summary = {
        f"audio_ar {r['variant']} MFU": f"{100 * r['mfu']:.1f}%" for r in rows if r.get("mfu")
    }
    result.set(summary=summary)
    latent_step(result, dry_run=dry_run)
    latent = result.doc["rows"][-1]
    result.set(summary={**summary, "latent step ms": latent["step_ms"]})
    result.finish()
