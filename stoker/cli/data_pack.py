"""`stoker data pack SRC DST`: media files in, shards + manifest out (stoker/data/pack.py)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from stoker.data.pack import PackReport


def pack(
    src: str = typer.Argument(
        ...,
        metavar="SRC",
        help="Folder or fsspec URL (s3://bucket/prefix) of media; sub-folders included.",
    ),
    dst: str = typer.Argument(
        ..., metavar="DST", help="Folder or fsspec URL the data set is written to."
    ),
    workers: int | None = typer.Option(
        None,
        "--workers",
        "-w",
        min=1,
        help="Processes writing shards (default: the CPU count). With --slurm: array "
        "tasks running at once (default: all).",
        show_default=False,
    ),
    clip_seconds: float | None = typer.Option(
        None,
        "--clip-seconds",
        min=0.001,
        help="Cut samples into clips this long (a shorter tail is dropped), re-encoded to "
        "short-GOP H.264 and FLAC. Default: copy files as they are.",
        show_default=False,
    ),
    target_shard_mb: float = typer.Option(
        256, "--target-shard-mb", min=0.001, help="Fill shards up to about this many MB."
    ),
    audio_stream: int = typer.Option(
        0,
        "--audio-stream",
        min=0,
        help="Which audio track of a video file is its sample's audio (0: the first); an "
        "audio file of the same name wins over any track. A re-run must repeat it.",
    ),
    slurm: bool = typer.Option(
        False, "--slurm", help="Write the shards in a SLURM job array (submitit)."
    ),
    partition: str | None = typer.Option(
        None, "--partition", "-p", help="With --slurm: the partition.", show_default=False
    ),
    time_min: int = typer.Option(
        60, "--time-min", min=1, help="With --slurm: time limit of each array task, minutes."
    ),
    cpus_per_task: int = typer.Option(
        1, "--cpus-per-task", min=1, help="With --slurm: CPU cores of each array task."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Discard a previous pack in DST instead of resuming it."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Last stdout line: {"samples": N, "shards": M, "skipped": [{"path", "reason", '
        '"kind"}, ...], "skipped_by_kind": {"not media": K, ...}}.',
    ),
) -> None:
    """Pack a folder of video and audio files into WebDataset shards with indexes and a manifest.

    Files sharing a name form one sample (clips/a.mp4 + clips/a.flac + clips/a.json +
    clips/a.txt -> key 'clips/a'). Any format FFmpeg reads is probed (mp4 m4v mov mkv
    webm avi ts mpg; wav flac ogg oga opus mp3 m4a aac aiff; others by content): a
    video's audio track is its sample's audio unless an audio file has its name.
    Files left out (not media, unreadable, empty, truncated, a sidecar without media)
    are reported with a count per reason, never fatal.
    Running the same command again resumes: finished shards are kept.

    Example: stoker data pack ./raw s3://bucket/av-v1 --clip-seconds 4 --slurm
    """
    from stoker.cli.output import err, note
    from stoker.data.pack import PackRequest, run_pack
    from stoker.data.pack_plan import PackOptions
    from stoker.errors import StokerError

    runner = None
    if slurm:
        from stoker.launcher.pack_array import SlurmArrayRunner, SlurmOptions

        runner = SlurmArrayRunner(
            SlurmOptions(partition=partition, time_min=time_min, cpus_per_task=cpus_per_task)
        )
    elif partition is not None or time_min != 60 or cpus_per_task != 1:
        raise StokerError(
            "--partition, --time-min and --cpus-per-task apply to SLURM array tasks",
            fix="add --slurm, or drop them",
        )
    request = PackRequest(
        src=src,
        dst=dst,
        options=PackOptions(
            clip_seconds=clip_seconds, target_shard_mb=target_shard_mb, audio_stream=audio_stream
        ),
        workers=workers,
        restart=restart,
        runner=runner,
    )
    if err().is_terminal:
        with _BarProgress() as progress:
            report = run_pack(request, progress)
    else:
        report = run_pack(request, _NoteProgress())
    note(
        f"wrote {report.written} of {report.planned} planned shards "
        f"({report.bytes_written / 1e6:.1f} MB) in {report.seconds:.1f} s"
    )
    if as_json:
        # One line, so `tail -n1 | jq` reads it whatever was printed before.
        sys.stdout.write(json.dumps(report.summary()) + "\n")
        return
    _print_report(report)


def _print_report(report: PackReport) -> None:
    from stoker.cli.output import out

    out().print(f"{report.samples} samples in {report.shards} shards: {report.manifest}")
    if report.skipped:
        counts = ", ".join(f"{n} {kind}" for kind, n in report.skipped_by_kind().items())
        out().print(f"skipped {len(report.skipped)} inputs ({counts}):", markup=False)
        for row in report.skipped:
            out().print(f"  {row['path']}: {row['reason']}", markup=False)


class _NoteProgress:
    """Off a terminal: one line per stage, no bar."""

    def start(self, description: str, total: int, completed: int = 0) -> None:
        from stoker.cli.output import note

        note(f"{description}: {total - completed} of {total} to write")

    def advance(self, amount: int = 1) -> None:
        pass

    def note(self, message: str) -> None:
        from stoker.cli.output import note

        note(message)


class _BarProgress:
    """A rich progress bar on stderr."""

    def __enter__(self) -> _BarProgress:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        from stoker.cli.output import err

        self._bar: Progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=err(),
        )
        self._task: TaskID | None = None
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.stop()

    def start(self, description: str, total: int, completed: int = 0) -> None:
        self._task = self._bar.add_task(description, total=total, completed=completed)

    def advance(self, amount: int = 1) -> None:
        if self._task is not None:
            self._bar.advance(self._task, amount)

    def note(self, message: str) -> None:
        self._bar.console.print(message, markup=False, highlight=False)
