"""`stoker data synth`: write a synthetic AV data set (real H.264 + FLAC) to any fsspec URL."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from stoker.plural import plural

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import ExitStack


def synth(
    dst: str = typer.Argument(
        ..., metavar="DST", help="Where to write: a folder, file://, memory:// or s3:// URL."
    ),
    clips: int = typer.Option(64, "--clips", help="Number of clips (samples)."),
    seconds: float = typer.Option(4.0, "--seconds", help="Length of each clip in seconds."),
    size: str = typer.Option(
        "64x64", "--size", metavar="HxW", help="Frame height x width in pixels, both even."
    ),
    fps: int = typer.Option(8, "--fps", help="Video frames per second."),
    sample_rate: int = typer.Option(16000, "--sample-rate", help="Audio sample rate in Hz."),
    seed: int = typer.Option(0, "--seed", help="Same seed and options, byte-identical shards."),
    shard_samples: int | None = typer.Option(
        None,
        "--shard-samples",
        help="Samples per shard. Default: as many as make ~64 MB shards.",
        show_default=False,
    ),
    workers: int = typer.Option(
        1, "--workers", help="Encoder processes; more than 1 pays off from a few hundred clips."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a data set already at DST."),
    files: bool = typer.Option(
        False,
        "--files",
        help="Write loose media files (clip-000000.mp4, .flac, .json, .txt) instead of "
        "shards: input for `stoker data pack`.",
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Print {"url", "samples", "shards", "bytes", "duration_s"} as the last stdout line.',
    ),
) -> None:
    """Write a synthetic AV data set a model can learn from, for demos and tests.

    Each clip is a coloured square or circle bouncing on a dark background (H.264
    mp4, one keyframe per second) with a stereo tone (FLAC) whose pitch follows the
    shape's height and whose pan follows its horizontal position, plus a caption
    (txt) and its parameters (json). The manifest is written last.

    Example: stoker data synth /tmp/toy --clips 64 --seconds 4 --size 64x64
    """
    import json
    import sys
    import time
    from contextlib import ExitStack

    from stoker.cli.output import out
    from stoker.data.synthetic.shapes import synth_dataset

    height, width = parse_size(size)
    start = time.perf_counter()
    if files:
        from stoker.data.synthetic.shapes import synth_media_files

        with ExitStack() as stack:
            written = synth_media_files(
                dst,
                clips=clips,
                seconds=seconds,
                size=(height, width),
                fps=fps,
                sample_rate=sample_rate,
                seed=seed,
                progress=_progress(stack, clips),
                workers=workers,
            )
        summary = {"url": dst, "files": clips * 4, "bytes": written}
        if as_json:
            sys.stdout.write(json.dumps(summary) + "\n")
        else:
            out().print(
                f"wrote {plural(clips, 'clip')} as {plural(clips * 4, 'file')} "
                f"({written / 1e6:.1f} MB) to {dst} "
                f"in {time.perf_counter() - start:.1f} s",
                markup=False,
            )
        return
    with ExitStack() as stack:
        manifest = synth_dataset(
            dst,
            clips=clips,
            seconds=seconds,
            size=(height, width),
            fps=fps,
            sample_rate=sample_rate,
            seed=seed,
            samples_per_shard=shard_samples,
            overwrite=overwrite,
            progress=_progress(stack, clips),
            workers=workers,
        )
    elapsed = time.perf_counter() - start
    shards = len(manifest.shards)
    if as_json:
        summary = {
            "url": dst,
            "samples": manifest.samples,
            "shards": shards,
            "bytes": manifest.totals.bytes,
            "duration_s": manifest.totals.duration_s,
        }
        sys.stdout.write(json.dumps(summary) + "\n")
        return
    out().print(
        f"wrote {plural(manifest.samples, 'clip')} ({manifest.totals.duration_s:g} s of media, "
        f"{manifest.totals.bytes / 1e6:.1f} MB in {plural(shards, 'shard')}) "
        f"to {dst} in {elapsed:.1f} s",
        markup=False,
    )


def _progress(stack: ExitStack, clips: int) -> Callable[[int], None]:
    """A rich bar on stderr on a terminal; else a plain line every PLAIN_EVERY_S (logs)."""
    from stoker.cli.output import err, note

    if err().is_terminal:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        bar = stack.enter_context(
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=err(),
            )
        )
        task = bar.add_task("synth clips", total=clips)
        return lambda done: bar.update(task, completed=done)

    import time

    last = time.monotonic()

    def plain(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if done == clips or now - last >= PLAIN_EVERY_S:
            last = now
            note(f"synth: {done}/{clips} clips")

    return plain


# Off a terminal (a log file, CI): one progress line at most this often, and the last.
PLAIN_EVERY_S = 10.0


def parse_size(value: str) -> tuple[int, int]:
    """`"64x64"` -> (64, 64): height then width, as --size spells them."""
    from stoker.errors import StokerError

    parts = value.lower().replace(" ", "").split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise StokerError(
            f"--size {value!r} is not HxW (height x width in pixels)", fix="e.g. --size 64x64"
        )
    return int(parts[0]), int(parts[1])
