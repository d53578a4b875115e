"""Decode one training clip from a sample's encoded bytes: RGB frames at a target
frame rate and size, or float audio at a target rate and channel count; and the
sample's array members (`.npy`, `.safetensors`) as they are stored.

The streaming loader calls these in its DataLoader workers, once per sample, with
one worker per core; so the decoders use one thread each, decode from the
keyframe before the clip to its last needed frame and no further, and convert to
RGB only the frames they return.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from stoker.data.format.shard_format import AudioInfo, VideoInfo
from stoker.data.media.errors import MediaError
from stoker.data.media.probe import SOUNDFILE_EXTS
from stoker.data.media.streams import (
    audio_stream,
    clockwise_rotation,
    time_origin_s,
    turned_upright,
    video_stream,
)

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

# Member extensions decoded as arrays: `npy`, or `<name>.npy` (WebDataset's extension is
# all after the key's first dot), and the same for safetensors.
ARRAY_EXTS = ("npy", "safetensors")

# Audio members soundfile reads with sample-exact seeks (probe.SOUNDFILE_EXTS); anything
# else (mp3, m4a, opus, audio inside a video container) goes through FFmpeg.

# swscale filter for resizing: AREA averages the source pixels under each output
# pixel when shrinking and is bilinear when enlarging. yuv420p 256x256 -> rgb24
# 128x128 on one core: AREA 113 us/frame, FAST_BILINEAR 115, BILINEAR 129,
# BICUBIC 171 (CPU time, median of 5).
_INTERPOLATION = "AREA"

# Container timestamps are rounded to their time base (mkv and webm store
# milliseconds), so a frame at k/24 s may be stamped 0.5 ms late. A frame counts as
# on screen at time t when its pts <= t + this, capped at a quarter frame period.
_PTS_TOLERANCE_S = 1e-3

# Audio read around the clip so the resampler's filter (about 32 taps of the
# lower rate) sees real signal at both edges instead of its zero start-up.
_AUDIO_MARGIN_S = 0.01

# FFmpeg audio is decoded from this long before the span after a seek: a codec's first
# frame after a seek lacks the previous frame it overlaps (AAC, MP3) or needs 80 ms to
# converge (Opus's pre-roll), so those samples are decoded and dropped.
_AUDIO_PREROLL_S = 0.1


def clip_start(duration_s: float, clip_seconds: float, u: float) -> float:
    """The start time of a clip given a uniform `u` in [0, 1): `u` spreads the start
    over [0, duration - clip], so no clip runs past the end of media long enough to
    hold it (u=0 is the fixed start at 0)."""
    if not 0.0 <= u < 1.0:
        raise ValueError(f"clip_start: u must lie in [0, 1), got {u}")
    return u * max(0.0, duration_s - clip_seconds)


def decode_video(
    data: bytes,
    *,
    fps: float,
    size: tuple[int, int] | None,
    start_s: float,
    clip_seconds: float,
    info: VideoInfo | None = None,
    resize: Literal["crop", "stretch"] = "stretch",
) -> npt.NDArray[np.uint8]:
    """`clip_seconds` of the first video stream from `start_s`, sampled at `fps`:
    uint8 RGB shaped (T, 3, H, W), T = round(clip_seconds * fps), (H, W) = `size`
    (None keeps the source's display size), upright: frames are turned by the
    container's rotation (`VideoInfo.rotation`), so `size` is the upright shape.

    `resize` "stretch" scales the frame to (H, W) whatever its aspect ratio; "crop"
    scales it to cover (H, W), keeping its aspect ratio, and keeps the centre.

    Frame i is the source frame on screen at start_s + i / fps, times counted from
    the stream's first frame (the origin `decode_audio` counts the same container's
    audio from); times past the end repeat the last frame. `info` (the
    shard index's probe) lets a decode that ends early be told from a clip that
    runs past the end: a stream ending before the frames `info` promises raises.
    Raises MediaError for bytes that do not decode.
    """
    count = round(clip_seconds * fps)
    if fps <= 0 or count < 1:
        raise ValueError(
            f"decode_video: fps={fps} and clip_seconds={clip_seconds} give {count} frames; "
            "both must be positive and give at least one frame"
        )
    if start_s < 0:
        raise ValueError(f"decode_video: start_s must be >= 0, got {start_s}")
    if size is not None and (size[0] < 1 or size[1] < 1):
        raise ValueError(f"decode_video: size is (height, width) >= 1, got {size}")
    if resize not in ("crop", "stretch"):
        raise ValueError(f"decode_video: resize is 'crop' or 'stretch', got {resize!r}")
    if not data:
        raise MediaError("empty file")
    import av

    try:
        for may_seek in (True, False):
            with av.open(io.BytesIO(data), mode="r") as container:
                stream = video_stream(container)
                if stream is None:
                    raise MediaError("no video stream")
                # One DataLoader worker per core: decoder threads only compete with the
                # other workers. CPU per 2 s clip (256x256 H.264 -> 16 frames 128x128):
                # threads off 15.1 ms, slice 15.9, frame 17.3, auto 17.9; frame threads
                # also decode frames past the clip's end (their delay).
                stream.codec_context.thread_type = "NONE"
                stream.codec_context.thread_count = 1
                try:
                    return _decode_clip(
                        container, stream, count, fps, (size, resize), start_s, info, may_seek
                    )
                except _SeekMissed:
                    # MPEG-TS and MPEG-PS seek by bytes and may land past the clip's start
                    # or between keyframes: decode from the first frame instead.
                    continue
        raise AssertionError("unreachable: a decode without seek does not miss")
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, OSError, IndexError, EOFError) as exc:
        raise MediaError(f"unreadable video ({type(exc).__name__}: {exc})") from exc


class _SeekMissed(Exception):
    """A seek landed past the clip's start, or where no frame decodes."""


def _decode_clip(
    container: Any,
    stream: Any,
    count: int,
    fps: float,
    shape: tuple[tuple[int, int] | None, str],
    start_s: float,
    info: VideoInfo | None,
    may_seek: bool,
) -> npt.NDArray[np.uint8]:
    size, resize = shape
    tb = float(stream.time_base)
    rate = stream.average_rate or stream.guessed_rate
    source_fps = info.fps if info is not None else (float(rate) if rate else 0.0)
    tol = _PTS_TOLERANCE_S if source_fps <= 0 else min(_PTS_TOLERANCE_S, 0.25 / source_fps)
    times = start_s + np.arange(count) / fps  # output frame i shows the source at times[i]
    origin = stream.start_time  # None for some raw streams: take the first frame's pts
    seek = may_seek and origin is not None and start_s > tol
    if seek:
        # To the keyframe at or before the clip's start; the frames from there to the
        # start are decoded (they are references) but never converted.
        container.seek(
            origin + int((start_s + tol) / tb), backward=True, any_frame=False, stream=stream
        )

    out: npt.NDArray[np.uint8] | None = None
    filled = 0  # output frames done
    held: Any = None  # the latest decoded frame: on screen until the next one's pts
    held_rgb: npt.NDArray[np.uint8] | None = None
    held_t = 0.0
    geometry: _Geometry | None = None

    def fill_until(limit: float) -> None:
        """Give `held` to every pending output time before `limit`."""
        nonlocal out, filled, held_rgb, geometry
        while filled < count and times[filled] < limit:
            if geometry is None:  # from the first frame: later ones follow it, should they change
                geometry = _Geometry.plan(held, size, resize)
            if held_rgb is None:
                held_rgb = _to_rgb(held, geometry)
            if out is None:
                _, height, width = held_rgb.shape
                out = np.empty((count, 3, height, width), dtype=np.uint8)
            out[filled] = held_rgb
            filled += 1

    for frame in container.decode(stream):
        if frame.pts is None:
            t = held_t + (1.0 / source_fps if source_fps > 0 else 0.0)
        else:
            if origin is None:
                origin = frame.pts
            t = (frame.pts - origin) * tb
        if held is None and seek and t > start_s + tol:
            # The seek landed past the clip's start (an index that is off): the
            # frames before it are unknown, so this one cannot stand in for them.
            raise _SeekMissed
        if held is not None:
            fill_until(t - tol)  # `held` was on screen until this frame appeared
        held, held_rgb, held_t = frame, None, t
        if filled == count:
            break
        # The next frame cannot appear before this one ends: when that is past the
        # clip's last time, this is the last frame needed (saves one decode). Only
        # at a constant rate: mp4 derives durations from decode times, which with
        # B-frames at a variable rate are not the time a frame stays on screen
        # (mkv rounds a 1/24 s duration to 42 ms: one tick of slack).
        if frame.duration and source_fps > 0 and abs(frame.duration - 1 / source_fps / tb) <= 1:
            fill_until(t + frame.duration * tb - tol)
            if filled == count:
                break

    if held is None:
        if seek:
            raise _SeekMissed
        raise MediaError("video stream decodes to no frames")
    if filled < count:
        if info is not None and source_fps > 0 and held_t < info.duration_s - 1.5 / source_fps:
            raise MediaError(
                f"truncated video: decoding ended at {held_t:.3f} s of {info.duration_s:.3f} s"
            )
        fill_until(math.inf)  # past the end: repeat the last frame
    assert out is not None
    return out


@dataclass(frozen=True)
class _Geometry:
    """How every frame of a clip becomes its output: one swscale call to (scaled_h,
    scaled_w), the window (top, left, height, width) of that, and a clockwise turn;
    all in the stored frame's orientation except `rotation`'s result."""

    scaled: tuple[int, int]
    window: tuple[int, int, int, int]
    rotation: int

    @staticmethod
    def plan(frame: Any, size: tuple[int, int] | None, resize: str) -> _Geometry:
        rotation = clockwise_rotation(frame)
        stored_h, stored_w = frame.height, frame.width
        if size is None:
            return _Geometry((stored_h, stored_w), (0, 0, stored_h, stored_w), rotation)
        # The upright target in the stored frame's orientation.
        height, width = (size[1], size[0]) if rotation in (90, 270) else size
        if resize == "stretch":
            return _Geometry((height, width), (0, 0, height, width), rotation)
        scale = max(height / stored_h, width / stored_w)  # cover the target
        scaled_h = max(height, round(stored_h * scale))
        scaled_w = max(width, round(stored_w * scale))
        top, left = (scaled_h - height) // 2, (scaled_w - width) // 2
        return _Geometry((scaled_h, scaled_w), (top, left, height, width), rotation)


def _to_rgb(frame: Any, geometry: _Geometry) -> npt.NDArray[np.uint8]:
    """Resize and convert to planar RGB (3, H, W) in one swscale call, on this thread:
    swscale's own threads cost 35% more CPU per frame at 256x256 -> 128x128. Planar
    GBR out of swscale spares the strided HWC -> CHW copy (23 -> 12 us per frame at
    128x128 measured here). A crop is a slice of that copy; a rotation a view of the
    result (copied once, into the clip)."""
    scaled_h, scaled_w = geometry.scaled
    top, left, height, width = geometry.window
    gbr = frame.reformat(
        width=scaled_w, height=scaled_h, format="gbrp", interpolation=_INTERPOLATION, threads=1
    )
    chw = np.empty((3, height, width), dtype=np.uint8)
    for channel, plane in zip((1, 2, 0), gbr.planes, strict=True):  # planes are G, B, R
        rows = np.frombuffer(plane, dtype=np.uint8).reshape(scaled_h, plane.line_size)
        chw[channel] = rows[top : top + height, left : left + width]
    return turned_upright(chw, geometry.rotation, axes=(1, 2))


def decode_audio(
    data: bytes,
    *,
    field: str,
    sample_rate: int,
    channels: int,
    start_s: float,
    clip_seconds: float,
    info: AudioInfo | None = None,
    stream: int | None = None,
) -> npt.NDArray[np.float32]:
    """`clip_seconds` of audio from `start_s`: float32 shaped (channels, N), N =
    round(clip_seconds * sample_rate), values in [-1, 1], zeros before the audio's
    first sample and past its end.

    `field` is the member's extension: flac, wav, ogg, oga and aiff are read by
    soundfile (seek, then only the clip's frames, sample-exact), anything else (mp3,
    m4a, opus, audio in a video container) by FFmpeg (within a millisecond in mkv and
    webm, whose timestamps are whole milliseconds). `stream` picks the file's audio
    stream, counted among its audio streams (default: `info.stream`, else 0). In a
    container with video, time counts from the first video frame, as in
    `decode_video`: the same `start_s` gives the same instant of both.
    Resampling is libswresample's windowed sinc. More channels become fewer
    by averaging (output channel j averages source channels j, j + channels, ...;
    all of them for mono), one becomes several by repeating. Raises MediaError for
    bytes that do not decode.
    """
    count = round(clip_seconds * sample_rate)
    if sample_rate < 1 or channels < 1 or count < 1:
        raise ValueError(
            f"decode_audio: sample_rate={sample_rate}, channels={channels}, "
            f"clip_seconds={clip_seconds} must be positive and give at least one sample"
        )
    if start_s < 0:
        raise ValueError(f"decode_audio: start_s must be >= 0, got {start_s}")
    if not data:
        raise MediaError("empty file")
    index = stream if stream is not None else info.stream if info is not None else 0
    read_from = max(0.0, start_s - _AUDIO_MARGIN_S)
    read_to = start_s + clip_seconds + _AUDIO_MARGIN_S
    pcm: tuple[npt.NDArray[np.float32], int, float] | None = None
    if field in SOUNDFILE_EXTS and index == 0:
        pcm = _read_soundfile(data, read_from, read_to)
    if pcm is None:  # not a soundfile format, or one libsndfile does not read
        pcm = _read_av(data, index, read_from, read_to)
    samples, source_rate, t0 = pcm
    ends = t0 + samples.shape[1] / source_rate
    if info is not None:
        info_ends = info.offset_s + info.duration_s
        if ends < min(read_to, info_ends) - _AUDIO_MARGIN_S:
            raise MediaError(
                f"truncated audio: decoding ended at {ends:.3f} s of {info_ends:.3f} s"
            )

    samples = _mix_channels(samples, channels) if samples.shape[0] > channels else samples
    if source_rate != sample_rate and samples.shape[1] > 0:
        samples = _resample(samples, source_rate, sample_rate)
    if samples.shape[0] < channels:
        samples = _mix_channels(samples, channels)

    # Output sample j is at start_s + j / sample_rate; samples[:, 0] is at t0.
    offset = round((start_s - t0) * sample_rate)
    out = np.zeros((channels, count), dtype=np.float32)
    have = samples[:, max(0, offset) : max(0, offset) + count - max(0, -offset)]
    out[:, max(0, -offset) : max(0, -offset) + have.shape[1]] = have
    np.clip(out, -1.0, 1.0, out=out)  # the sinc filter overshoots near full scale
    return out


def _read_soundfile(
    data: bytes, read_from: float, read_to: float
) -> tuple[npt.NDArray[np.float32], int, float] | None:
    """(channels, frames) float32 from read_from to read_to seconds, the rate and the
    time of the first frame; None when libsndfile cannot open the bytes."""
    import soundfile as sf

    try:
        with sf.SoundFile(io.BytesIO(data)) as f:
            rate = f.samplerate
            first = int(read_from * rate)
            last = math.ceil(read_to * rate)
            if f.frames > 0 and first >= f.frames:
                return np.zeros((f.channels, 0), dtype=np.float32), rate, first / rate
            f.seek(first)
            block = f.read(frames=last - first, dtype="float32", always_2d=True)
            declared = f.frames
    except (sf.LibsndfileError, RuntimeError, TypeError):
        return None
    if declared > 0 and len(block) < min(last, declared) - first:
        raise MediaError(
            f"truncated audio: {first + len(block)} of {declared} frames the header states"
        )
    return np.ascontiguousarray(block.T), rate, first / rate


def _read_av(
    data: bytes, index: int, read_from: float, read_to: float
) -> tuple[npt.NDArray[np.float32], int, float]:
    """As _read_soundfile, through FFmpeg, from audio stream `index`: seek, decode the
    frames covering the span. Times count from the container's first video frame, or
    from the audio's own start in a container without video."""
    import av

    try:
        pcm = _decode_av_span(data, index, read_from, read_to, seek=True)
        if pcm is None:  # the seek landed past the span (MPEG-TS seeks by bytes): no seek
            pcm = _decode_av_span(data, index, read_from, read_to, seek=False)
            assert pcm is not None
    except MediaError:
        raise
    except (av.FFmpegError, ValueError, OSError, IndexError, EOFError) as exc:
        raise MediaError(f"unreadable audio ({type(exc).__name__}: {exc})") from exc
    samples, rate, t0 = pcm
    first = max(0, int((read_from - t0) * rate))
    samples = samples[:, first : max(first, math.ceil((read_to - t0) * rate))]
    return samples.astype(np.float32, copy=False), rate, t0 + first / rate


def _decode_av_span(
    data: bytes, index: int, read_from: float, read_to: float, *, seek: bool
) -> tuple[npt.NDArray[Any], int, float] | None:
    """(channels, frames) decoded from before `read_from` to `read_to`, the rate and the
    time of the first frame; None when `seek` lands past `read_from`."""
    import av

    with av.open(io.BytesIO(data), mode="r") as container:
        stream = audio_stream(container, index)
        rate = stream.codec_context.sample_rate
        tb = stream.time_base
        origin = time_origin_s(container)
        if origin is None and stream.start_time is not None:
            origin = float(stream.start_time * tb)
        seek_to = read_from - _AUDIO_PREROLL_S
        seeked = seek and origin is not None and seek_to > 0
        if seeked:
            assert origin is not None
            target = int((origin + seek_to) / tb)
            container.seek(target, backward=True, any_frame=False, stream=stream)
        # Planar float at the source rate and layout: a format change only.
        planar = av.AudioResampler(format="fltp")
        blocks: list[npt.NDArray[Any]] = []
        t0: float | None = None
        got = 0
        frames = container.decode(stream)
        while True:
            try:
                frame = next(frames, None)
            except av.FFmpegError:
                if seeked:  # MPEG-PS seeks land mid-packet (mp2: invalid data): no seek
                    return None
                raise
            if frame is None:
                break
            if t0 is None:
                if origin is None:
                    origin = float((frame.pts or 0) * tb)
                t0 = float(frame.pts * tb) - origin if frame.pts is not None else 0.0
                rate = frame.sample_rate
                if seeked and t0 > read_from + 1.0 / rate:
                    return None
            for converted in planar.resample(frame):
                blocks.append(converted.to_ndarray())
            got += frame.samples
            if t0 + got / rate >= read_to:
                break
        if t0 is None:
            if seeked:
                return None
            raise MediaError("audio stream decodes to no samples")
    samples = np.concatenate(blocks, axis=1) if blocks else np.zeros((1, 0))
    return samples, rate, t0


def _mix_channels(samples: npt.NDArray[np.float32], channels: int) -> npt.NDArray[np.float32]:
    have = samples.shape[0]
    if have == channels:
        return samples
    if have > channels:  # output j averages sources j, j + channels, ...
        return np.stack([samples[j::channels].mean(axis=0) for j in range(channels)])
    # fewer -> more: output j repeats source j * have // channels (1 -> n repeats it)
    return samples[[j * have // channels for j in range(channels)]]


def _resample(
    samples: npt.NDArray[np.float32], source_rate: int, rate: int
) -> npt.NDArray[np.float32]:
    """libswresample, one mono pass per channel (any channel count, no remixing);
    output sample 0 lies at input sample 0, and the flush gives the exact tail."""
    import av

    out = []
    for channel in samples:
        resampler = av.AudioResampler(format="fltp", layout="mono", rate=rate)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(channel[None], dtype=np.float32), format="fltp", layout="mono"
        )
        frame.sample_rate = source_rate
        frame.pts = 0
        parts = [f.to_ndarray()[0] for f in resampler.resample(frame)]
        parts += [f.to_ndarray()[0] for f in resampler.resample(None)]
        out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32))
    length = min(len(c) for c in out)
    return np.stack([c[:length] for c in out]).astype(np.float32, copy=False)


def array_fields(fields: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The member extensions among `fields` that decode as arrays (`npy`, `latent.npy`,
    `safetensors`, ...), in their order."""
    return tuple(f for f in fields if f.rsplit(".", 1)[-1] in ARRAY_EXTS)


def decode_array(data: bytes, field: str) -> torch.Tensor | dict[str, torch.Tensor]:
    """An array member as stored: a `.npy` as one tensor (its dtype and shape, native
    byte order), a `.safetensors` as a dict of tensors by name. Never unpickles: an
    object array is refused. Raises MediaError for bytes that do not load."""
    import torch

    if field.rsplit(".", 1)[-1] == "safetensors":
        from stoker.data.media.safetensors_view import load_view

        return load_view(data, field)
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise MediaError(f"unreadable .{field} ({type(exc).__name__}: {exc})") from exc
    if not isinstance(array, np.ndarray):  # an .npz archive under a .npy name
        raise MediaError(f"unreadable .{field}: holds {type(array).__name__}, not one array")
    try:
        # np.load gives a read-only view of the bytes: a copy torch may own and write,
        # in native byte order (torch has no big-endian tensors).
        return torch.from_numpy(np.array(array, dtype=array.dtype.newbyteorder("="), order="C"))
    except TypeError as exc:  # a dtype torch lacks: strings, structured records
        raise MediaError(f".{field} holds dtype {array.dtype}, which no tensor has") from exc
