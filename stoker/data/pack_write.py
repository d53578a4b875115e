"""Write one planned shard: read its samples from SRC, probe them, cut clips when
asked, and write the tar and its index under DST.

Runs in a worker process or a SLURM array task, so everything it needs travels in
a picklable `ShardTask` and it opens both filesystems itself (fsspec's async
filesystems are not fork-safe). Bad media never fail a shard: a sample
whose files cannot be read, probed or decoded is left out and reported. The
shard's report goes to DST/pack-skipped/ before the tar, so "index present" (the
shard is finished) also means its report is there for a resuming run.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, TypeVar

from stoker.data.encode import encode_flac, encode_h264
from stoker.data.pack_plan import PlannedSample, SkippedInput, open_location
from stoker.data.probe import MediaError, probe_audio, probe_member, probe_video
from stoker.data.shard_format import (
    SHARDS_DIR,
    AudioInfo,
    VideoInfo,
    join,
    shard_file_name,
)
from stoker.data.shard_writer import SampleToWrite, write_json_atomic, write_shard

SKIPPED_DIR = "pack-skipped"
_T = TypeVar("_T")


@dataclass(frozen=True)
class ShardTask:
    """Everything one shard writer needs; pickled to a worker or a SLURM task."""

    src_url: str
    dst_url: str
    number: int
    samples: tuple[PlannedSample, ...]
    clip_seconds: float | None = None


@dataclass
class ShardResult:
    number: int
    samples: int
    """Samples written (clips, with --clip-seconds)."""
    bytes: int
    skipped: list[SkippedInput] = field(default_factory=list)


def shard_path(number: int) -> str:
    """The shard's tar, relative to DST."""
    return f"{SHARDS_DIR}/{shard_file_name(number)}"


def skipped_path(number: int) -> str:
    """The shard's list of skipped inputs, relative to DST."""
    return f"{SKIPPED_DIR}/{shard_file_name(number).removesuffix('.tar')}.json"


class _Skip(Exception):
    """The sample is left out; `entries` say which of its files and why."""

    def __init__(self, path: str, reason: str, *more: SkippedInput) -> None:
        super().__init__(reason)
        self.entries = [SkippedInput(path=path, reason=reason), *more]


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
            samples += _build_sample(src_fs, src_root, planned, task.clip_seconds)
        except _Skip as skip:
            skipped += skip.entries
    report = join(dst_root, skipped_path(task.number))
    dst_fs.makedirs(report.rsplit("/", 1)[0], exist_ok=True)
    rows = [s.model_dump() for s in skipped]
    write_json_atomic(dst_fs, report, (json.dumps(rows, indent=1) + "\n").encode())
    index = write_shard(dst_fs, join(dst_root, shard_path(task.number)), samples)
    return ShardResult(
        number=task.number, samples=len(index.samples), bytes=index.bytes, skipped=skipped
    )


def write_planned_shards(tasks: list[ShardTask]) -> list[ShardResult]:
    """Several shards one after the other: one SLURM array task's share."""
    return [write_planned_shard(task) for task in tasks]


def _build_sample(
    fs: Any, root: str, planned: PlannedSample, clip_seconds: float | None
) -> list[SampleToWrite]:
    data: dict[str, bytes] = {}
    for ext, member in planned.members.items():
        try:
            data[ext] = fs.cat_file(join(root, member.path))
        except OSError as exc:
            raise _Skip(member.path, f"unreadable ({type(exc).__name__}: {exc})") from exc
        if len(data[ext]) != member.size:
            raise _Skip(
                member.path,
                f"changed while packing ({len(data[ext])} bytes, {member.size} when listed)",
            )
    infos: dict[str, VideoInfo | AudioInfo] = {}
    broken: list[SkippedInput] = []
    for ext, blob in data.items():
        try:
            info = probe_member(blob, ext)
        except MediaError as exc:
            broken.append(SkippedInput(path=planned.members[ext].path, reason=str(exc)))
            continue
        except Exception as exc:  # hostile input: FFmpeg raises more than it documents
            reason = f"unreadable ({exc!r})"
            broken.append(SkippedInput(path=planned.members[ext].path, reason=reason))
            continue
        if info is not None:
            infos[ext] = info
    if broken:
        raise _Skip(broken[0].path, broken[0].reason, *broken[1:])
    video = next((i for i in infos.values() if isinstance(i, VideoInfo)), None)
    audio = next((i for i in infos.values() if isinstance(i, AudioInfo)), None)
    if clip_seconds is None:
        return [SampleToWrite(key=planned.key, members=data, video=video, audio=audio)]
    return _clips(planned, data, video, audio, clip_seconds)


def _clips(
    planned: PlannedSample,
    data: dict[str, bytes],
    video: VideoInfo | None,
    audio: AudioInfo | None,
    seconds: float,
) -> list[SampleToWrite]:
    """The sample cut into whole clips of `seconds`, video as short-GOP H.264 mp4 and
    audio as FLAC; .json gains the clip's start and end, .txt is copied."""
    path = {ext: m.path for ext, m in planned.members.items()}
    streams = [(i.field, i.duration_s) for i in (video, audio) if i is not None]
    count = min(int(duration / seconds + 1e-6) for _, duration in streams)
    if count == 0:
        shortest = min(streams, key=lambda s: s[1])
        raise _Skip(
            path[shortest[0]],
            f"shorter ({shortest[1]:g} s) than --clip-seconds {seconds:g}: no whole clip",
        )
    meta: dict[str, Any] | None = None
    if "json" in data:
        try:
            meta = json.loads(data["json"])
        except ValueError as exc:
            raise _Skip(path["json"], f"not JSON ({exc}); clips add their times to it") from exc
        if not isinstance(meta, dict):
            raise _Skip(path["json"], "not a JSON object; clips add their times to it")
    video_clips: list[tuple[bytes, VideoInfo]] = []
    audio_clips: list[tuple[bytes, AudioInfo]] = []
    if video is not None:
        video_clips = _decoded(
            path[video.field], _video_clips, data[video.field], video.fps, seconds, count
        )
    if audio is not None:
        audio_clips = _decoded(path[audio.field], _audio_clips, data[audio.field], seconds, count)
    made = min(
        len(clips)
        for clips, info in ((video_clips, video), (audio_clips, audio))
        if info is not None
    )
    if made == 0:
        raise _Skip(path[streams[0][0]], "no whole clip decodes")
    out = []
    for i in range(made):
        members: dict[str, bytes] = {}
        v_info = a_info = None
        if video is not None:
            members["mp4"], v_info = video_clips[i]
        if audio is not None:
            members["flac"], a_info = audio_clips[i]
        if meta is not None:
            clip = {
                "index": i,
                "start_s": round(i * seconds, 6),
                "end_s": round((i + 1) * seconds, 6),
            }
            members["json"] = json.dumps({**meta, "clip": clip}, ensure_ascii=False).encode()
        if "txt" in data:
            members["txt"] = data["txt"]
        out.append(
            SampleToWrite(
                key=f"{planned.key}_c{i:04d}", members=members, video=v_info, audio=a_info
            )
        )
    return out


def _decoded(path: str, cut: Callable[..., Iterator[_T]], *args: Any) -> list[_T]:
    """All clips `cut(*args)` makes; a file that probed fine can still fail to decode."""
    try:
        return list(cut(*args))
    except Exception as exc:  # hostile input: FFmpeg raises more than it documents
        raise _Skip(path, f"fails to decode ({exc!r})") from exc


def _video_clips(
    data: bytes, fps: float, seconds: float, count: int
) -> Iterator[tuple[bytes, VideoInfo]]:
    """Up to `count` whole clips, re-encoded at the source's frame rate."""
    import av

    per_clip = max(1, round(seconds * fps))
    with av.open(io.BytesIO(data), mode="r") as container:
        stream = container.streams.video[0]
        # The exact rate (30000/1001 for NTSC's 29.97), not the probe's rounded float.
        rate = stream.average_rate or Fraction(fps).limit_denominator(1001)
        stream.thread_type = "AUTO"
        frames = (f.to_ndarray(format="rgb24", threads=1) for f in container.decode(stream))
        for _ in range(count):
            chunk = itertools.islice(frames, per_clip)
            first = next(chunk, None)
            if first is None:
                return
            # yuv420p needs an even size: drop an odd last row or column.
            height, width = first.shape[0] & ~1, first.shape[1] & ~1
            if height == 0 or width == 0:
                raise MediaError(f"frames of {first.shape[0]}x{first.shape[1]} are too small")
            taken = [0]
            encoded = encode_h264(
                _cropped(itertools.chain([first], chunk), height, width, taken),
                fps=rate,
                width=width,
                height=height,
            )
            if taken[0] < per_clip:
                return  # the tail is shorter than a clip
            yield encoded, probe_video(encoded, "mp4")


def _cropped(frames: Iterator[Any], height: int, width: int, taken: list[int]) -> Iterator[Any]:
    import numpy as np

    for frame in frames:
        taken[0] += 1
        yield np.ascontiguousarray(frame[:height, :width])


def _audio_clips(data: bytes, seconds: float, count: int) -> Iterator[tuple[bytes, AudioInfo]]:
    """Up to `count` whole clips as FLAC, at the source's rate and channels."""
    import soundfile as sf

    try:
        f = sf.SoundFile(io.BytesIO(data))
    except (RuntimeError, sf.LibsndfileError, TypeError):  # as in probe_audio: ask FFmpeg
        yield from _audio_clips_av(data, seconds, count)
        return
    with f:
        per_clip = round(seconds * f.samplerate)
        for _ in range(count):
            block = f.read(per_clip, dtype="float32", always_2d=True)
            if len(block) < per_clip:
                return
            encoded = encode_flac(block, sample_rate=f.samplerate)
            yield encoded, probe_audio(encoded, "flac")


def _audio_clips_av(data: bytes, seconds: float, count: int) -> Iterator[tuple[bytes, AudioInfo]]:
    import av
    import numpy as np

    with av.open(io.BytesIO(data), mode="r") as container:
        ctx = container.streams.audio[0].codec_context
        rate, channels = ctx.sample_rate, ctx.channels
        # Packed float: one (1, samples * channels) array per frame.
        resampler = av.AudioResampler(format="flt", layout=ctx.layout, rate=rate)
        parts = []
        for frame in itertools.chain(container.decode(audio=0), [None]):
            parts += [f.to_ndarray().reshape(-1, channels) for f in resampler.resample(frame)]
    wave = np.concatenate(parts) if parts else np.zeros((0, channels), np.float32)
    per_clip = round(seconds * rate)
    for i in range(count):
        block = wave[i * per_clip : (i + 1) * per_clip]
        if len(block) < per_clip:
            return
        encoded = encode_flac(block, sample_rate=rate)
        yield encoded, probe_audio(encoded, "flac")
