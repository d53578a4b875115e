"""`stoker data bench`: loader throughput and decode headroom on this machine."""

from __future__ import annotations

import typer


def bench(
    url: str = typer.Argument(..., metavar="URL", help="Data set root (folder, s3://, ...)."),
    workers: int = typer.Option(2, "--workers", help="DataLoader worker processes."),
    batch_size: int = typer.Option(8, "--batch-size", help="Samples per batch."),
    batches: int = typer.Option(20, "--batches", help="Batches to time (after a first one)."),
    step_rate: float = typer.Option(
        1.0, "--step-rate", help="Steps/s the trainer needs: headroom is measured against it."
    ),
    fps: float = typer.Option(8, "--fps", help="Video frames per second after resampling."),
    size: str = typer.Option("64x64", "--size", metavar="HxW", help="Output frame size."),
    clip_seconds: float = typer.Option(1.0, "--clip-seconds", help="Clip length in seconds."),
    sample_rate: int = typer.Option(16000, "--sample-rate", help="Audio rate after resampling."),
    modalities: str = typer.Option(
        "video,audio", "--modalities", help="Comma-separated: video, audio, text, meta."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the figures as JSON."),
) -> None:
    """Time the streaming loader: samples/s, frames/s per core, bytes/s, headroom.

    Headroom = loader steps/s / --step-rate: below 1 the trainer waits for data;
    add workers (one per core), cut resolution or fps at pack time, or pack
    shorter GOPs.

    Example: stoker data bench s3://bucket/av --workers 8 --batch-size 32 --step-rate 2
    """
    from stoker.cli.data_synth import parse_size
    from stoker.cli.output import out, print_json
    from stoker.data.bench_loader import bench_loader

    height, width = parse_size(size)
    result = bench_loader(
        url,
        workers=workers,
        batch_size=batch_size,
        batches=batches,
        step_rate=step_rate,
        loader_options={
            "fps": fps,
            "size": (height, width),
            "clip_seconds": clip_seconds,
            "sample_rate": sample_rate,
            "modalities": tuple(m.strip() for m in modalities.split(",") if m.strip()),
        },
    )
    if as_json:
        print_json(result)
        return
    verdict = "enough" if (result["headroom"] or 0) >= 1 else "NOT enough: the trainer would wait"
    out().print(
        f"{result['samples_per_s']:g} samples/s ({result['steps_per_s']:g} steps/s of "
        f"{batch_size}) with {workers} workers\n"
        f"{result['frames_per_s_per_core']:g} decoded frames/s per core, "
        f"{result['bytes_per_s'] / 1e6:.1f} MB/s read, "
        f"{result['decode_s_per_sample'] * 1e3:.1f} ms decode per sample\n"
        f"headroom {result['headroom']}x against {step_rate:g} steps/s: {verdict}\n"
        f"(first batch after {result['first_batch_s']:g} s: worker start-up)",
        markup=False,
    )
