"""Part c: the training step of the 1b av_dit on one GPU (bf16 autocast, fp32 weights
and AdamW states, batch 8 of 2 s 256x256 clips = 16704 tokens, the activation
checkpointing part b's plan chose for 80 GiB), stoker's kernels eager and compiled,
then without them (the reference modules eager and compiled): step time, tokens/s,
MFU, peak memory (stoker.runtime.bench_step, as `stoker bench step`).

On one GPU the runtime runs one process without FSDP (FSDP2 starts at two ranks), and
so does this step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_check.result import PartResult
from stoker.runtime import bench_step

TARGET_MFU = 0.50
VARIANTS = ("stoker", "stoker+compile", "reference", "compile")


def planned_checkpointing(out_dir: Path) -> str:
    """Part b's choice, when it ran; else none (the 1b at batch 8 fits 80 GB without)."""
    try:
        plan = json.loads((out_dir / "plan.json").read_text())
        return str(plan["plan"]["chosen"]["activation_checkpointing"])
    except (OSError, KeyError, TypeError, ValueError):
        return "none"


def run_steps(
    result: PartResult,
    arch: str,
    *,
    dry_run: bool,
    variants: tuple[str, ...],
    batch_size: int | None,
    label: str,
    steps: int,
    warmup: int,
    checkpointing: str,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def progress(row: dict[str, Any]) -> None:
        row = {"arch": arch, "setup": label, **row}
        rows.append(row)
        result.add_row(row)
        print(f"{label}: {bench_step.format_row(row)}", flush=True)

    kwargs: dict[str, Any] = {}
    if dry_run:
        kwargs = {"resolution": (64, 64), "clip_seconds": 1.0}
    document = bench_step.run(
        arch,
        "tiny" if dry_run else "1b",
        batch_size=2 if dry_run else batch_size,
        variants=variants,
        steps=steps,
        warmup=warmup,
        device=torch.device("cpu" if dry_run else "cuda"),
        activation_checkpointing=checkpointing,
        progress=progress,
        **kwargs,
    )
    meta = {k: v for k, v in document.items() if k != "rows"}
    result.set(**{f"{label}_setup": meta})
    return rows


def main(out_dir: Path, *, dry_run: bool) -> None:
    result = PartResult(out_dir, "step", dry_run=dry_run)
    checkpointing = "none" if dry_run else planned_checkpointing(out_dir)
    variants = ("stoker", "reference") if dry_run else VARIANTS
    rows = run_steps(
        result,
        "av_dit",
        dry_run=dry_run,
        variants=variants,
        batch_size=8,
        label="av_dit",
        steps=2 if dry_run else 8,
        warmup=1 if dry_run else 3,
        checkpointing=checkpointing,
    )
    by_name = {r["variant"]: r for r in rows}
    summary: dict[str, Any] = {"AC": checkpointing}
    for name in variants:
        row = by_name.get(name)
        if row and row.get("mfu") is not None:
            summary[f"{name} MFU"] = f"{100 * row['mfu']:.1f}%"
    best = max((r for r in rows if r.get("mfu") is not None), key=lambda r: r["mfu"], default=None)
    if best is not None and not dry_run:
        result.check(
            "1b step >= 50% MFU",
            f"MFU >= {TARGET_MFU:.0%} with stoker's kernels",
            f"{100 * best['mfu']:.1f}% ({best['variant']}, {best['step_ms']:.0f} ms, "
            f"{best['peak_memory_gb']} GB)",
            best["mfu"] >= TARGET_MFU,
        )
    result.set(summary=summary)
    result.finish()
