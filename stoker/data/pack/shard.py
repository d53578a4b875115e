"""Write one planned shard: read its samples from SRC, probe them, cut clips when
asked, and write the tar and its index under DST.

Runs in a worker process or a SLURM array task, so everything it needs travels in
a picklable `ShardTask` and it opens both filesystems itself (fsspec's async
filesystems are not fork-safe). Bad media never fail a shard: a sample
whose files cannot be read, probed or decoded is left out and reported. The
shard's report goes to DST/pack-skipped/ before the tar, so "index present" (the
shard is finished) also means its report is there for a resuming run.

What the probe finds decides each file's role: the file with a video stream is the
sample's video, a file with audio only its audio. The audio comes from the audio
file when there is one (explicit beats implicit), else from the video file's audio
track `--audio-stream` (default: its first). A file with a media extension that does
not read takes its sample down; a file of another extension that is no media (a
subtitle, a photo, a PDF) is reported and left out, and its sample goes on.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field
from typing import Any

from stoker.data.format.shard_format import AUDIO_EXTS, VIDEO_EXTS, join, shard_file_name
from stoker.data.media.errors import UNREADABLE, MediaError
from stoker.data.media.probe import MediaProbe, probe_media
from stoker.data.pack.clips import ClipsFailed, cut_clips
from stoker.data.pack.plan import (
    NAME_CONFLICT,
    SIDECAR_EXTS,
    SIDECAR_WITHOUT_MEDIA,
    PlannedSample,
    SkippedInput,
)
from stoker.data.write.location import open_location
from stoker.data.write.shard_set import shard_path
from stoker.data.write.shard_writer import SampleToWrite, write_json_atomic, write_shard

SKIPPED_DIR = "pack-skipped"
CHANGED = "changed while packing"
"""The report kind of a file whose size differs from the listing's."""


@dataclass(frozen=True)
class ShardTask:
    """Everything one shard writer needs; pickled to a worker or a SLURM task."""

    src_url: str
    dst_url: str
    number: int
    samples: tuple[PlannedSample, ...]
    clip_seconds: float | None = None
    audio_stream: int = 0
    """PackOptions.audio_stream: the audio track taken from a video file."""


@dataclass
class ShardResult:
    number: int
    samples: int
    """Samples written (clips, with --clip-seconds)."""
    bytes: int
    skipped: list[SkippedInput] = field(default_factory=list)


def skipped_path(number: int) -> str:
    """The shard's list of skipped inputs, relative to DST."""
    return f"{SKIPPED_DIR}/{shard_file_name(number).removesuffix('.tar')}.json"


class _Skip(Exception):
    """The sample is left out; `entries` say which of its files and why."""

    def __init__(self, entries: list[SkippedInput]) -> None:
        super().__init__(entries[0].reason)
        self.entries = entries


def write_planned_shard(task: ShardTask) -> ShardResult:
    """Write shard `task.number` and its skip report; return what was written.

    The shard's samples are held in memory (about --target-shard-mb) until all are
    built: only then is the skip report complete, and it must precede the tar."""
    src_fs, src_root, _ = open_location(task.src_url)
    dst_fs, dst_root, _ = open_location(task.dst_url)
    samples: list[SampleToWrite] = []
    skipped: list[SkippedInput] = []
    for planned in task.samples:
        try:
            built, left_out = _build_sample(src_fs, src_root, planned, task)
        except _Skip as skip:
            skipped += skip.entries
            continue
        samples += built
        skipped += left_out
    report = join(dst_root, skipped_path(task.number))
    dst_fs.makedirs(report.rsplit("/", 1)[0], exist_ok=True)
    rows = [s.model_dump() for s in skipped]
    write_json_atomic(dst_fs, report, (json.dumps(rows, indent=1) + "\n").encode())
    index = write_shard(dst_fs, join(dst_root, shard_path(task.number)), samples)
    return ShardResult(
        number=task.number, samples=len(index.samples), bytes=index.bytes, skipped=skipped
    )


def _build_sample(
    fs: Any, root: str, planned: PlannedSample, task: ShardTask
) -> tuple[list[SampleToWrite], list[SkippedInput]]:
    """The sample's records to write, and its files left out while it is packed."""
    path = {ext: member.path for ext, member in planned.members.items()}
    data: dict[str, bytes] = {}
    for ext, member in planned.members.items():
        try:
            data[ext] = fs.cat_file(join(root, member.path))
        except OSError as exc:
            reason = f"unreadable ({type(exc).__name__}: {exc})"
            raise _Skip([SkippedInput(path=member.path, reason=reason, kind=UNREADABLE)]) from exc
        if len(data[ext]) != member.size:
            reason = f"changed while packing ({len(data[ext])} bytes, {member.size} when listed)"
            raise _Skip([SkippedInput(path=member.path, reason=reason, kind=CHANGED)])
    probes: dict[str, MediaProbe] = {}
    broken: list[SkippedInput] = []
    left_out: list[SkippedInput] = []
    for ext, blob in data.items():
        if ext in SIDECAR_EXTS:
            continue
        try:
            probes[ext] = probe_media(blob, ext, audio_stream=task.audio_stream)
        except MediaError as exc:
            entry = SkippedInput(path=path[ext], reason=str(exc), kind=exc.kind)
            (broken if ext in VIDEO_EXTS or ext in AUDIO_EXTS else left_out).append(entry)
        except Exception as exc:  # hostile input: FFmpeg raises more than it documents
            entry = SkippedInput(path=path[ext], reason=f"unreadable ({exc!r})", kind=UNREADABLE)
            (broken if ext in VIDEO_EXTS or ext in AUDIO_EXTS else left_out).append(entry)
    if broken:
        raise _Skip(broken + left_out)
    videos = [ext for ext, probe in probes.items() if probe.video is not None]
    audios = [ext for ext, probe in probes.items() if probe.video is None]
    for kind, same in (("video", videos), ("audio", audios)):
        if len(same) > 1:
            names = " and ".join(posixpath.basename(path[e]) for e in same)
            reason = f"{names} share one name: a sample holds one {kind} file; rename one"
            raise _Skip(
                [SkippedInput(path=path[e], reason=reason, kind=NAME_CONFLICT) for e in same]
            )
    video = probes[videos[0]].video if videos else None
    audio = probes[audios[0]].audio if audios else None
    if videos and not audios:
        track = probes[videos[0]]
        if track.audio_error is not None:
            reason = f"its audio track: {track.audio_error}"
            entry = SkippedInput(path=path[videos[0]], reason=reason, kind=track.audio_error.kind)
            raise _Skip([entry, *left_out])
        audio = track.audio
    if video is None and audio is None:  # every candidate proved no media
        sidecars = [
            SkippedInput(
                path=path[e], reason="no media file shares its name", kind=SIDECAR_WITHOUT_MEDIA
            )
            for e in data
            if e in SIDECAR_EXTS
        ]
        raise _Skip(left_out + sidecars)
    members = {e: blob for e, blob in data.items() if e in SIDECAR_EXTS or e in probes}
    if task.clip_seconds is None:
        return [SampleToWrite(key=planned.key, members=members, video=video, audio=audio)], left_out
    try:
        clips = cut_clips(planned.key, path, members, video, audio, task.clip_seconds)
    except ClipsFailed as exc:
        raise _Skip(
            [SkippedInput(path=exc.path, reason=exc.reason, kind=exc.kind), *left_out]
        ) from exc
    return clips, left_out
