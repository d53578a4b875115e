"""Cut one sample into whole clips for `stoker data pack --clip-seconds`: video
re-encoded as short-GOP H.264 mp4, upright, at the source's frame rate; audio as
FLAC at the source's rate and channels; both cut at the same instants.

Clip i covers [i * S, (i + 1) * S) seconds of the sample's time, which counts from
the first video frame (stoker.data.media.streams): frames are the source frames on
screen at k / rate (a variable-frame-rate source comes out at a constant rate), and
the audio is decoded by `decode_audio` for that span, so a track that starts late in
its container starts late in the clips too, and audio in a separate file is taken
to start with the video's first frame.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar

from stoker.data.format.shard_format import AudioInfo, VideoInfo
from stoker.data.media.decode import decode_audio
from stoker.data.media.errors import UNREADABLE, MediaError
from stoker.data.media.h264_flac import encode_flac, encode_h264
from stoker.data.media.probe import probe_audio, probe_video
from stoker.data.media.streams import clockwise_rotation, turned_upright, video_stream
from stoker.data.write.shard_writer import SampleToWrite

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

_T = TypeVar("_T")

TOO_SHORT = "shorter than a clip"
"""The kind of report for a sample that holds no whole clip."""

# As in decode_video: a frame counts as on screen at time t when its pts <= t + this.
_PTS_TOLERANCE_S = 1e-3


class ClipsFailed(Exception):
    """No clip of the sample can be made: the file to blame, why, and the report kind."""

    def __init__(self, path: str, reason: str, kind: str) -> None:
        super().__init__(reason)
        self.path, self.reason, self.kind = path, reason, kind


def cut_clips(
    key: str,
    paths: dict[str, str],
    data: dict[str, bytes],
    video: VideoInfo | None,
    audio: AudioInfo | None,
    seconds: float,
) -> list[SampleToWrite]:
    """Sample `key` (its members' bytes `data` and source `paths` by extension) cut into
    whole clips of `seconds`, keyed `<key>_c0000`, ...: members mp4 and flac, .json
    with the clip's start and end added, .txt copied. Raises ClipsFailed."""
    ends = []
    if video is not None:
        ends.append((video.field, video.duration_s))
    if audio is not None:
        ends.append((audio.field, audio.offset_s + audio.duration_s))
    # Within a millisecond: mkv and webm round times to it (2 s of 24 fps ends at 1.999).
    count = min(int((end + _PTS_TOLERANCE_S) / seconds) for _, end in ends)
    if count == 0:
        shortest = min(ends, key=lambda e: e[1])
        raise ClipsFailed(
            paths[shortest[0]],
            f"shorter ({shortest[1]:g} s) than --clip-seconds {seconds:g}: no whole clip",
            TOO_SHORT,
        )
    meta: dict[str, Any] | None = None
    if "json" in data:
        try:
            meta = json.loads(data["json"])
        except ValueError as exc:
            raise ClipsFailed(
                paths["json"], f"not JSON ({exc}); clips add their times to it", UNREADABLE
            ) from exc
        if not isinstance(meta, dict):
            raise ClipsFailed(
                paths["json"], "not a JSON object; clips add their times to it", UNREADABLE
            )
    video_clips: list[tuple[bytes, VideoInfo]] = []
    audio_clips: list[tuple[bytes, AudioInfo]] = []
    if video is not None:
        video_clips = _decoded(
            paths[video.field], _video_clips, data[video.field], video, seconds, count
        )
    if audio is not None:
        audio_clips = _decoded(
            paths[audio.field], _audio_clips, data[audio.field], audio, seconds, count
        )
    made = min(
        len(clips)
        for clips, info in ((video_clips, video), (audio_clips, audio))
        if info is not None
    )
    if made == 0:
        raise ClipsFailed(paths[ends[0][0]], "no whole clip decodes", UNREADABLE)
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
            SampleToWrite(key=f"{key}_c{i:04d}", members=members, video=v_info, audio=a_info)
        )
    return out


def _decoded(path: str, cut: Callable[..., Iterator[_T]], *args: Any) -> list[_T]:
    """All clips `cut(*args)` makes; a file that probed fine can still fail to decode."""
    try:
        return list(cut(*args))
    except Exception as exc:  # hostile input: FFmpeg raises more than it documents
        raise ClipsFailed(path, f"fails to decode ({exc!r})", UNREADABLE) from exc


def _video_clips(
    data: bytes, video: VideoInfo, seconds: float, count: int
) -> Iterator[tuple[bytes, VideoInfo]]:
    """Up to `count` whole clips, re-encoded at the source's frame rate."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        stream = video_stream(container)
        if stream is None:
            raise MediaError("no video stream")
        # The exact rate (30000/1001 for NTSC's 29.97), not the probe's rounded float.
        rate = stream.average_rate or Fraction(video.fps).limit_denominator(1001)
        stream.thread_type = "AUTO"
        per_clip = max(1, round(seconds * rate))
        frames = _frames_on_screen(container, stream, rate, video.duration_s)
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


def _frames_on_screen(
    container: Any, stream: Any, rate: Fraction, end_s: float
) -> Iterator[npt.NDArray[np.uint8]]:
    """Upright RGB frames (H, W, 3) at times k / rate from the first frame: the source
    frame on screen then, until the stream's end `end_s`."""
    tb = stream.time_base
    origin = stream.start_time
    period = 1 / float(rate)
    tol = min(_PTS_TOLERANCE_S, 0.25 * period)
    k = 0
    held: Any = None
    held_rgb: npt.NDArray[np.uint8] | None = None
    held_t = 0.0
    rotation = 0
    for frame in container.decode(stream):
        if frame.pts is None:
            t = held_t + period
        else:
            if origin is None:
                origin = frame.pts
            t = float((frame.pts - origin) * tb)
        if held is None:
            rotation = clockwise_rotation(frame)
        while held is not None and k * period < t - tol:  # `held` on screen until now
            if held_rgb is None:
                held_rgb = _upright_rgb(held, rotation)
            yield held_rgb
            k += 1
        held, held_rgb, held_t = frame, None, t
    while held is not None and k * period < end_s - tol:
        if held_rgb is None:
            held_rgb = _upright_rgb(held, rotation)
        yield held_rgb
        k += 1


def _upright_rgb(frame: Any, rotation: int) -> npt.NDArray[np.uint8]:
    rgb: npt.NDArray[np.uint8] = frame.to_ndarray(format="rgb24", threads=1)
    return turned_upright(rgb, rotation, axes=(0, 1))


def _cropped(frames: Iterator[Any], height: int, width: int, taken: list[int]) -> Iterator[Any]:
    import numpy as np

    for frame in frames:
        taken[0] += 1
        yield np.ascontiguousarray(frame[:height, :width])


def _audio_clips(
    data: bytes, audio: AudioInfo, seconds: float, count: int
) -> Iterator[tuple[bytes, AudioInfo]]:
    """Up to `count` whole clips as FLAC, at the source's rate and channels, each
    decoded for its span of the sample's time (sample-exact for the formats soundfile
    reads; FFmpeg's within a millisecond)."""
    for i in range(count):
        block = decode_audio(
            data,
            field=audio.field,
            sample_rate=audio.sample_rate,
            channels=audio.channels,
            start_s=i * seconds,
            clip_seconds=seconds,
            info=audio,
        )
        encoded = encode_flac(block.T, sample_rate=audio.sample_rate)
        yield encoded, probe_audio(encoded, "flac")
