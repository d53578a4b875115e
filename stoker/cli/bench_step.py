"""`stoker bench step`: training-step throughput and MFU of one model on one
device, Triton kernels against the reference modules and torch.compile."""

from __future__ import annotations

from pathlib import Path

import typer


def _resolution(text: str) -> tuple[int, int]:
    from stoker.errors import StokerError

    parts = text.lower().split("x")
    try:
        height, width = (int(p) for p in parts)
    except ValueError:
        height = width = 0
    if height < 8 or width < 8:
        raise StokerError(
            f"--resolution {text!r} is not HEIGHTxWIDTH in pixels (each at least 8)",
            fix="for example --resolution 256x256",
        )
    return height, width


def step(
    arch: str = typer.Option("av_dit", "--arch", help="av_dit or audio_ar."),
    size: str = typer.Option("1b", "--size", help="tiny, small, base, large or 1b."),
    batch_size: int | None = typer.Option(
        None,
        "--batch-size",
        min=1,
        help="Samples per step; default 8 for av_dit, 2 for audio_ar on a GPU (sized for "
        "the 1b on 80 GB), 2 on the CPU.",
    ),
    variants: str = typer.Option(
        "stoker,reference,compile",
        "--variants",
        help="Comma-separated: stoker (Triton kernels), reference (torch modules, eager), "
        "compile (reference, blocks torch.compile'd), stoker+compile.",
    ),
    steps: int = typer.Option(20, "--steps", min=1, help="Timed steps (the median is kept)."),
    warmup: int = typer.Option(5, "--warmup", min=0, help="Untimed steps first (they compile)."),
    resolution: str = typer.Option(
        "256x256", "--resolution", help="Video frame HEIGHTxWIDTH (av_dit)."
    ),
    fps: int = typer.Option(8, "--fps", min=1, help="Video frames per second (av_dit)."),
    clip_seconds: float = typer.Option(
        2.0, "--clip-seconds", min=0.001, help="Clip length: frames and audio samples per sample."
    ),
    activation_checkpointing: str = typer.Option(
        "none", "--activation-checkpointing", help="none, selective or full."
    ),
    device: str = typer.Option(
        "auto", "--device", help="auto (the GPU if any), cuda, cuda:N or cpu (harness check)."
    ),
    out: Path = typer.Option(
        Path("benchmarks/results"), "--out", help="Folder for step-<gpu>-<date>.json."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the result document as JSON."),
) -> None:
    """Time full training steps (forward, backward, AdamW) in bf16 autocast.

    Reports per variant the median step time, samples/s, tokens/s, TFLOP/s,
    MFU against the GPU's bf16 peak and peak memory, written to
    OUT/step-<gpu>-<date>.json. The default clip (2 s, 8 fps, 256x256, mono
    16 kHz) gives the 1b av_dit 2088 tokens a sample. On a CPU every variant
    runs the reference kernels and only checks the harness.

    Example: stoker bench step --size 1b --variants stoker,compile --steps 30
    """
    from stoker.errors import StokerError

    names = [v.strip() for v in variants.split(",") if v.strip()]
    frame = _resolution(resolution)

    from stoker.cli.bench_device import parse_device
    from stoker.cli.output import out as console
    from stoker.cli.output import print_json
    from stoker.kernels import KernelBackendError
    from stoker.runtime import bench_step

    dev = parse_device(device)
    progress = (
        None if as_json else (lambda row: console().print(bench_step.format_row(row), markup=False))
    )
    try:
        result = bench_step.run(
            arch,
            size,
            batch_size=batch_size,
            variants=names,
            steps=steps,
            warmup=warmup,
            device=dev,
            resolution=frame,
            fps=fps,
            clip_seconds=clip_seconds,
            activation_checkpointing=activation_checkpointing,
            progress=progress,
        )
    except KernelBackendError as exc:
        raise StokerError(exc.message, fix=exc.fix) from exc
    except MemoryError as exc:
        raise StokerError(
            str(exc), fix="lower --batch-size, or use --activation-checkpointing selective or full"
        ) from exc
    except ValueError as exc:
        raise StokerError(
            str(exc),
            fix="data.resolution, data.fps and data.clip_seconds are set by --resolution, "
            "--fps and --clip-seconds; see stoker bench step --help",
        ) from exc
    path = bench_step.write_result(result, out)
    if as_json:
        print_json({**result, "path": str(path)})
        return
    model = result["model"]
    console().print(
        f"{model['size']} {model['arch']}: {model['params'] / 1e6:.1f} M params, "
        f"{model['tokens_per_sample']} tokens and {model['flops_per_sample'] / 1e9:.1f} GFLOP "
        f"a sample, batch {result['batch_size']}, on {result['device']}",
        markup=False,
    )
    for row in result["rows"]:
        speedups = ", ".join(f"{v:.2f}x {b}" for b, v in row["speedup"].items() if v is not None)
        console().print(f"{row['variant']}: {speedups or 'no baseline ran'}", markup=False)
    console().print(f"wrote {path}")
