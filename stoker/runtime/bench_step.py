"""The training-step benchmark behind `stoker bench step` and benchmarks/step.py:
full steps (forward, backward, gradient clipping, AdamW) of one model on one
device, in bf16 autocast with fp32 weights and AdamW states, for each variant:

- stoker: the Triton kernels of stoker.kernels (on CUDA; the reference on CPU);
- reference: the pure-torch reference modules, eager;
- compile: the reference modules, each block torch.compile'd (the runtime's
  `train.compile`);
- stoker+compile: the Triton kernels inside compiled blocks.

A step is the trainer's: loss under autocast, backward, clip_grad_norm_, one
host sync on the non-finite flag, optimizer step, zero_grad. The batch is
synthetic and stays on the device (random uint8 video, random audio): no
loader, no disk. Timing: `warmup` untimed steps (they compile), then CUDA
events around each of `steps` steps (perf_counter on the CPU), the median.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import json
import math
import socket
import statistics
import time
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from stoker.kernels import use_backend
from stoker.kernels.backend import Resolved
from stoker.kernels.bench.run import device_name, device_slug
from stoker.runtime.dist.parallelize import apply_activation_checkpointing, apply_compile
from stoker.runtime.models import TrainingModel, build_model, peak_flops
from stoker.runtime.optim import build_optimizer


# The settings build_model, build_optimizer and the data shapes read, as plain
# dataclasses: GPU nodes run this benchmark from a plain checkout with torch,
# triton, typer and rich, where stoker.config's pydantic may be missing.
def _as(settings: Any) -> Any:
    """A Bench* dataclass where stoker.config's model is expected: duck-typed,
    it has every field those functions read."""
    return settings


@dataclasses.dataclass(frozen=True)
class BenchModel:
    arch: str = "av_dit"
    size: str = "tiny"
    kernels: str = "auto"
    args: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class BenchData:
    batch_size: int = 8
    clip_seconds: float = 1.0
    fps: int = 8
    resolution: tuple[int, int] = (64, 64)
    sample_rate: int = 16_000
    channels: int = 1
    modalities: list[str] = dataclasses.field(default_factory=lambda: ["video", "audio"])


@dataclasses.dataclass(frozen=True)
class BenchOptim:
    lr: float = 3e-4
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float | None = 1.0


ARCHS = ("av_dit", "audio_ar")
VARIANTS = ("stoker", "reference", "compile", "stoker+compile")
DEFAULT_VARIANTS = ("stoker", "reference", "compile")
BASELINES = ("reference", "compile")
CHECKPOINTING = ("none", "selective", "full")
TARGET_MFU = 0.45

# The default clip: 2 s at 8 fps of 256x256 video, mono 16 kHz audio. For the
# 1b av_dit (2x16x16 video patches, 800-sample audio patches) that is
# 8 x 16 x 16 = 2048 video tokens + 40 audio tokens = 2088 tokens a sample,
# the sequence length of a realistic pixel-space video DiT; for the 1b
# audio_ar, min(8192, 32000) = 8192 tokens.
DEFAULT_RESOLUTION = (256, 256)
DEFAULT_FPS = 8
DEFAULT_CLIP_SECONDS = 2.0
SAMPLE_RATE = 16_000
CHANNELS = 1

# Samples per step on a GPU, chosen for the 1b presets on an 80 GB H100 at the
# default clip with the reference modules (the most memory-hungry variant):
# weights, gradients and AdamW moments in fp32 take 16 bytes x 1.08e9 params =
# 17 GB, autocast's bf16 weight copies 2 GB. Saved activations, measured with
# saved-tensor hooks under bf16 autocast: 384 MB per block and sample for the
# av_dit at 2088 tokens (90 bytes per token and channel), 5.4 GB a sample over
# 14 blocks, so batch 8 needs about 44 + 19 = 63 GB; the audio_ar's 8192 tokens
# take 1.17 GB per block and sample, 23 GB over 20 blocks, so batch 2 needs
# about 47 + 18 = 65 GB. Smaller presets fit the same batch with room to spare.
DEFAULT_BATCH_SIZE = {"av_dit": 8, "audio_ar": 2}
# On the CPU the run only checks the harness (its figures mean nothing).
CPU_BATCH_SIZE = 2


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    kernels: str
    """The kernel backend asked for: "triton" or "reference"."""
    compiled: bool


def variant(name: str) -> Variant:
    return Variant(
        name,
        kernels="triton" if name.startswith("stoker") else "reference",
        compiled=name.endswith("compile"),
    )


def resolved_backend(asked: str, device: torch.device) -> Resolved:
    """Triton runs on CUDA only: on the CPU every variant is the reference."""
    return "triton" if asked == "triton" and device.type == "cuda" else "reference"


def check_options(
    arch: str, variants: Sequence[str], activation_checkpointing: str, steps: int, warmup: int
) -> None:
    """ValueError naming each bad value and the values allowed."""
    problems = []
    if arch not in ARCHS:
        problems.append(f"arch {arch!r} is not one of {', '.join(ARCHS)}")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        problems.append(
            f"variants {', '.join(map(repr, unknown)) or '(none)'}: "
            f"use some of {', '.join(VARIANTS)}"
        )
    if len(set(variants)) != len(variants):
        problems.append(f"variants {list(variants)} name one variant twice")
    if activation_checkpointing not in CHECKPOINTING:
        problems.append(
            f"activation checkpointing {activation_checkpointing!r} is not one of "
            f"{', '.join(CHECKPOINTING)}"
        )
    if steps < 1 or warmup < 0:
        problems.append(f"steps {steps} / warmup {warmup}: need steps >= 1 and warmup >= 0")
    if problems:
        raise ValueError("; ".join(problems))


def data_config(
    arch: str,
    *,
    resolution: tuple[int, int],
    fps: int,
    clip_seconds: float,
    batch_size: int,
) -> BenchData:
    """The clip shape the model is built for (the audio_ar reads audio only)."""
    modalities: list[Any] = ["video", "audio"] if arch == "av_dit" else ["audio"]
    return BenchData(
        batch_size=batch_size,
        clip_seconds=clip_seconds,
        fps=fps,
        resolution=resolution,
        sample_rate=SAMPLE_RATE,
        channels=CHANNELS,
        modalities=modalities,
    )


def synthetic_batch(data: BenchData, batch_size: int, device: torch.device) -> dict[str, Any]:
    """A batch shaped as the loader's, made on the device: uint8 video
    [B, T, 3, H, W], float32 audio in [-1, 1] [B, C, N]."""
    out: dict[str, Any] = {}
    if "video" in data.modalities:
        frames = round(data.clip_seconds * data.fps)
        shape = (batch_size, frames, 3, *data.resolution)
        out["video"] = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    samples = round(data.clip_seconds * data.sample_rate)
    out["audio"] = torch.rand(batch_size, data.channels, samples, device=device) * 2 - 1
    return out


def _significant(value: float, digits: int = 5) -> float:
    """Rounded to `digits` significant digits: CPU and GPU figures differ by 10^5."""
    return float(f"{value:.{digits}g}")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _event() -> torch.cuda.Event:
    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]


def bench_variant(
    name: str,
    *,
    arch: str,
    size: str,
    data: BenchData,
    batch_size: int,
    activation_checkpointing: str,
    device: torch.device,
    steps: int,
    warmup: int,
) -> dict[str, Any]:
    """Build, wrap and time one variant; its row without the speed-ups."""
    spec = variant(name)
    backend = resolved_backend(spec.kernels, device)
    torch._dynamo.reset()  # a fresh compile per variant: no cache or guard from the last
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with use_backend(backend):
        torch.manual_seed(0)
        with device:
            model = typing.cast(
                TrainingModel, build_model(_as(BenchModel(arch=arch, size=size)), _as(data))
            )
        apply_activation_checkpointing(model, activation_checkpointing)
        if spec.compiled:
            apply_compile(model)
        optim = BenchOptim()
        optimizer = build_optimizer(model, _as(optim), device)
        params = [p for p in model.parameters() if p.requires_grad]
        max_norm = optim.grad_clip if optim.grad_clip is not None else math.inf
        batch = synthetic_batch(data, batch_size, device)
        # One noise generator per sample, as the trainer draws noise.
        noise = [torch.Generator(device=device).manual_seed(i) for i in range(batch_size)]
        nonfinite = 0

        def step() -> torch.Tensor:
            nonlocal nonfinite
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = model.loss(batch, noise)
            loss.backward()  # type: ignore[no-untyped-call]
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            # The trainer's one host sync per step: skip a non-finite step.
            if bool(torch.isfinite(loss.detach()) & torch.isfinite(norm)):
                optimizer.step()
            else:
                nonfinite += 1
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        began = time.perf_counter()
        for _ in range(warmup):
            step()
        _sync(device)
        warmup_s = time.perf_counter() - began
        if device.type == "cuda":
            events = [(_event(), _event()) for _ in range(steps)]
            for start, end in events:
                start.record()
                loss = step()
                end.record()
            _sync(device)
            times = [start.elapsed_time(end) for start, end in events]
        else:
            times = []
            for _ in range(steps):
                began = time.perf_counter()
                loss = step()
                times.append((time.perf_counter() - began) * 1e3)
        final_loss = float(loss)

    step_ms = float(statistics.median(times))
    samples_per_s = batch_size / (step_ms * 1e-3)
    flops_per_s = model.flops_per_sample() * samples_per_s
    peak = peak_flops(device)
    row = {
        "variant": name,
        "backend": backend,
        "compiled": spec.compiled,
        "step_ms": round(step_ms, 3),
        "step_ms_min": round(min(times), 3),
        "step_ms_max": round(max(times), 3),
        "samples_per_s": _significant(samples_per_s),
        "tokens_per_s": _significant(samples_per_s * model.tokens_per_sample()),
        "tflops": _significant(flops_per_s / 1e12),
        "mfu": _significant(flops_per_s / peak) if peak else None,
        "peak_memory_gb": (
            round(torch.cuda.max_memory_allocated(device) / 1e9, 2)
            if device.type == "cuda"
            else None
        ),
        "warmup_s": round(warmup_s, 2),
        "loss": final_loss,
        "nonfinite_steps": nonfinite,
    }
    return row


def add_speedups(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row with speedup[baseline] = baseline step_ms / its step_ms (None
    when the baseline did not run)."""
    ms = {r["variant"]: r["step_ms"] for r in rows}
    return [
        {
            **r,
            "speedup": {
                b: (round(ms[b] / r["step_ms"], 3) if b in ms else None) for b in BASELINES
            },
        }
        for r in rows
    ]


def describe_model(arch: str, size: str, data: BenchData) -> dict[str, Any]:
    with torch.device("meta"):
        model = typing.cast(
            TrainingModel, build_model(_as(BenchModel(arch=arch, size=size)), _as(data))
        )
    return {
        "arch": arch,
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "matmul_params": model.matmul_params(),
        "tokens_per_sample": model.tokens_per_sample(),
        "flops_per_sample": model.flops_per_sample(),
    }


def run(
    arch: str = "av_dit",
    size: str = "1b",
    *,
    batch_size: int | None = None,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    steps: int = 20,
    warmup: int = 5,
    device: torch.device | None = None,
    resolution: tuple[int, int] = DEFAULT_RESOLUTION,
    fps: int = DEFAULT_FPS,
    clip_seconds: float = DEFAULT_CLIP_SECONDS,
    activation_checkpointing: str = "none",
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Time training steps of each variant; returns the result document (see
    docs/runtime.md, "Step benchmark"). ValueError names a bad option, or a
    clip shape the model's patches do not divide (from build_model)."""
    check_options(arch, variants, activation_checkpointing, steps, warmup)
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE[arch] if device.type == "cuda" else CPU_BATCH_SIZE
    data = data_config(
        arch, resolution=resolution, fps=fps, clip_seconds=clip_seconds, batch_size=batch_size
    )
    model = describe_model(arch, size, data)  # refuses a bad shape before any work
    rows = []
    for name in variants:
        try:
            row = bench_variant(
                name,
                arch=arch,
                size=size,
                data=data,
                batch_size=batch_size,
                activation_checkpointing=activation_checkpointing,
                device=device,
                steps=steps,
                warmup=warmup,
            )
        except torch.cuda.OutOfMemoryError as exc:
            raise MemoryError(
                f"variant {name!r}: batch {batch_size} of the {size} {arch} at "
                f"{model['tokens_per_sample']} tokens a sample ran out of memory on "
                f"{device_name(device)}"
            ) from exc
        rows.append(row)
        if progress:
            progress(row)
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": device_name(device),
        "device_slug": device_slug(device),
        "host": socket.gethostname(),
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "peak_flops": peak_flops(device),
        "model": model,
        "data": {
            "resolution": list(resolution),
            "fps": fps,
            "clip_seconds": clip_seconds,
            "sample_rate": SAMPLE_RATE,
            "channels": CHANNELS,
            "modalities": list(data.modalities),
        },
        "batch_size": batch_size,
        "precision": "bf16 autocast, fp32 weights and AdamW states",
        "activation_checkpointing": activation_checkpointing,
        "timing": {
            "warmup": warmup,
            "steps": steps,
            "statistic": "median",
            "clock": "cuda events" if device.type == "cuda" else "perf_counter",
        },
        "rows": add_speedups(rows),
        "target_mfu": TARGET_MFU,
    }


_SETUP_KEYS = ("device_slug", "date", "model", "data", "batch_size", "activation_checkpointing")


def _setup(doc: dict[str, Any]) -> str:
    return json.dumps({k: doc.get(k) for k in _SETUP_KEYS}, sort_keys=True)


def write_result(result: dict[str, Any], out_dir: Path) -> Path:
    """Write step-<gpu>-<date>.json in out_dir. A file of that day for the same
    model, clip, batch and checkpointing keeps its rows of other variants (a
    benchmark run in parts adds up); one for another setup is left alone and
    this one goes to step-<gpu>-<date>-2.json (-3, ...)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"step-{result['device_slug']}-{result['date']}"
    number = 1
    while True:
        path = out_dir / (f"{stem}.json" if number == 1 else f"{stem}-{number}.json")
        if not path.exists():
            break
        old = json.loads(path.read_text())
        if _setup(old) == _setup(result):
            fresh = {r["variant"] for r in result["rows"]}
            kept = [r for r in old.get("rows", []) if r["variant"] not in fresh]
            result = {**result, "rows": add_speedups(kept + result["rows"])}
            break
        number += 1
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=1) + "\n")
    tmp.replace(path)
    return path


def format_row(row: dict[str, Any]) -> str:
    mfu = f"MFU {100 * row['mfu']:5.1f}%" if row["mfu"] is not None else "MFU    -"
    memory = (
        f"{row['peak_memory_gb']:6.1f} GB" if row["peak_memory_gb"] is not None else "     - GB"
    )
    speedups = "  ".join(
        f"{v:.2f}x {b}" for b, v in row.get("speedup", {}).items() if v is not None
    )
    return (
        f"{row['variant']:<15} {row['backend']:<9} {row['step_ms']:9.1f} ms "
        f"{row['samples_per_s']:8.2f} samples/s {row['tokens_per_s']:10.0f} tokens/s "
        f"{row['tflops']:8.3g} TFLOP/s  {mfu}  peak {memory}  {speedups}"
    ).rstrip()
