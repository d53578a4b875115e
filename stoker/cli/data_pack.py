"""`stoker data pack SRC DST`: media files in, shards + manifest out (stoker/data/pack/pipeline.py);
with --slurm, as a job array through stoker's launcher (stoker/launcher/launch/data_array.py,
each task stoker/data/jobs/pack_task.py)."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import typer

from stoker.plural import plural

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from stoker.data.pack.pipeline import PackReport, PackRequest, PreparedPack
    from stoker.launcher.launch.data_array import ArrayOptions


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
        False, "--slurm", help="Write the shards in a SLURM job array; returns with its job id."
    ),
    tasks: int | None = typer.Option(
        None,
        "--tasks",
        min=1,
        help="With --slurm: array tasks (default: one per shard, at most 100).",
        show_default=False,
    ),
    partition: str | None = typer.Option(
        None, "--partition", "-p", help="With --slurm: the partition.", show_default=False
    ),
    time: str | None = typer.Option(
        None,
        "--time",
        help="With --slurm: each task's time limit (sbatch's forms: 30, 2:00:00, 1-0).",
        show_default=False,
    ),
    cpus_per_task: int | None = typer.Option(
        None,
        "--cpus-per-task",
        min=1,
        help="With --slurm: CPU cores of each array task.",
        show_default=False,
    ),
    wait: bool = typer.Option(
        False, "--wait", help="With --slurm: follow the job to its end, then report the pack."
    ),
    restart: bool = typer.Option(
        False, "--restart", help="Discard a previous pack in DST instead of resuming it."
    ),
    as_json: bool = typer.Option(
        False,
        "--json",
        help='Last stdout line: {"samples": N, "shards": M, "skipped": [{"path", "reason", '
        '"kind"}, ...], "skipped_by_kind": {"not media": K, ...}}; with --slurm and no '
        '--wait, the job: {"job_id", "run_id", "run_dir", "child_run_ids"}.',
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

    With --slurm the shards are written by a job array through stoker's launcher:
    the command returns with the job id (`stoker status`, `logs`, `why`, `cancel` know
    it), the task that ends last writes the manifest; --wait follows the job and
    reports the pack as a local run does.

    Example: stoker data pack ./raw s3://bucket/av-v1 --clip-seconds 4 --slurm --time 2:00:00
    """
    from stoker.cli.array_wait import refuse_slurm_flags
    from stoker.cli.output import err
    from stoker.data.pack.pipeline import PackRequest, run_pack
    from stoker.data.pack.plan import PackOptions
    from stoker.launcher.launch.job_flags import JobFlags, command_line

    slurm_flags = JobFlags(partition=partition, time=time, cpus_per_task=cpus_per_task)
    given = {"--tasks": tasks, **slurm_flags.given(command_line), "--wait": wait}
    refuse_slurm_flags(slurm, given, "pack")
    request = PackRequest(
        src=src,
        dst=dst,
        options=PackOptions(
            clip_seconds=clip_seconds, target_shard_mb=target_shard_mb, audio_stream=audio_stream
        ),
        workers=None if slurm else workers,
        restart=restart,
    )
    if slurm:
        from stoker.launcher.launch.data_array import ArrayOptions

        options = ArrayOptions(tasks=tasks, slurm=slurm_flags, max_parallel=workers)
        _pack_on_slurm(request, options, wait, as_json)
        return
    if err().is_terminal:
        with _BarProgress() as progress:
            report = run_pack(request, progress)
    else:
        report = run_pack(request, _NoteProgress())
    _report(report, as_json)


def _pack_on_slurm(request: PackRequest, options: ArrayOptions, wait: bool, as_json: bool) -> None:
    """Plan here, queue the missing shards as an array; with `wait`, follow it and report."""
    from stoker.cli.output import note, out
    from stoker.data.pack.pipeline import prepare_pack
    from stoker.launcher.launch.data_array import submit_pack

    started = time.monotonic()
    prepared = prepare_pack(request)
    submitted = submit_pack(request, options, prepared=prepared)
    if submitted is None:
        note("every shard is already written: nothing to submit")
        _finish(request, prepared, started, as_json, states={})
        return
    out().print(
        f"submitted pack job {submitted.job_id}: {len(prepared.pending)} of "
        f"{plural(len(prepared.plan.shards), 'shard')} to write",
        markup=False,
    )
    job = submitted.job_id
    note(f"`stoker status {job}` follows it; `stoker logs {job}_0` shows a task's log")
    if not wait:
        if as_json:
            import json

            sys.stdout.write(json.dumps(submitted.as_json()) + "\n")
        return
    from stoker.cli.array_wait import wait_for_array

    states = wait_for_array(submitted.job_id)
    _finish(request, prepared, started, as_json, states=states)


def _finish(
    request: PackRequest,
    prepared: PreparedPack,
    started: float,
    as_json: bool,
    states: dict[str, str],
) -> None:
    """After the array ended (or with nothing left to write): the manifest and the report."""
    from stoker.data.format.shard_format import MANIFEST_NAME
    from stoker.data.pack.pipeline import finish_pack
    from stoker.data.write.shard_set import finished_shards
    from stoker.errors import StokerError

    report = finish_pack(request.src, prepared, started)
    if report is None:
        planned = len(prepared.plan.shards)
        done = len(finished_shards(prepared.dst_fs, prepared.dst_root, range(planned)))
        failed = [task for task, state in states.items() if state != "COMPLETED"]
        ended = ", ".join(f"{task} {states[task]}" for task in failed)
        raise StokerError(
            f"the pack of {request.dst} ended with {done} of {plural(planned, 'shard')} written "
            f"(no {MANIFEST_NAME} yet){': ' + ended if ended else ''}",
            fix=f"`stoker why {failed[0] if failed else 'JOB'}` says what failed; fix it and run "
            "the same command again: it keeps the finished shards and writes the rest",
        )
    _report(report, as_json)


def _report(report: PackReport, as_json: bool) -> None:
    from stoker.cli.output import note

    note(
        f"wrote {report.written} of {plural(report.planned, 'planned shard')} "
        f"({report.bytes_written / 1e6:.1f} MB) in {report.seconds:.1f} s"
    )
    if as_json:
        import json

        # One line, so `tail -n1 | jq` reads it whatever was printed before.
        sys.stdout.write(json.dumps(report.summary()) + "\n")
        return
    _print_report(report)


def _print_report(report: PackReport) -> None:
    from stoker.cli.output import out

    out().print(
        f"{plural(report.samples, 'sample')} in {plural(report.shards, 'shard')}: {report.manifest}"
    )
    if report.skipped:
        counts = ", ".join(f"{n} {kind}" for kind, n in report.skipped_by_kind().items())
        out().print(f"skipped {plural(len(report.skipped), 'input')} ({counts}):", markup=False)
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
