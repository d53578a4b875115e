"""Real media made with PyAV for the tests of the formats, the packer and the decoders.

Small on purpose (64x48 px, 1-2 s): the suite runs on a loaded 2-core machine.
Video frames are black, white at the event times, with a red block in the stored
frame's top-left corner (where a rotation puts it tells the turn); audio is a sine
of its own frequency per track, with a full-scale click at the event times.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
from av.stream import Disposition

EVENTS = (0.5, 1.25)
"""When the white frame shows and the click sounds, in seconds."""


@dataclass(frozen=True)
class VideoSpec:
    codec: str = "libx264"
    width: int = 64
    height: int = 48
    fps: int = 24
    pix_fmt: str = "yuv420p"
    rotation: int = 0
    """Clockwise degrees a player turns the frames (stored in the display matrix)."""
    frame_times: tuple[float, ...] | None = None
    """Presentation times of a variable-frame-rate stream (default: k / fps)."""
    start_s: float = 0.0
    """Time of the first frame."""
    events: tuple[float, ...] = EVENTS


@dataclass(frozen=True)
class AudioSpec:
    codec: str = "aac"
    rate: int = 48000
    layout: str = "mono"
    freq: float = 440.0
    """A quiet sine of this frequency under the clicks (0: silence)."""
    start_s: float = 0.0
    """Time of the first sample."""
    events: tuple[float, ...] = EVENTS
    options: dict[str, str] = field(default_factory=dict)


def white_frames(video: np.ndarray) -> list[int]:
    """Indices of the frames of a (T, 3, H, W) clip that are mostly white."""
    return [i for i in range(len(video)) if video[i].mean() > 128]


def clicks(audio: np.ndarray, rate: int) -> list[float]:
    """Times (s) at which clicks start in a (C, N) clip, 0.1 s apart at least."""
    loud = np.nonzero(np.abs(audio).max(axis=0) > 0.6)[0]
    out: list[float] = []
    for i in loud:
        if not out or i / rate - out[-1] > 0.1:
            out.append(i / rate)
    return out


def dominant_hz(audio: np.ndarray, rate: int) -> float:
    """The strongest frequency of a (C, N) clip's first channel."""
    spectrum = np.abs(np.fft.rfft(audio[0] * np.hanning(audio.shape[1])))
    return float(np.argmax(spectrum) * rate / audio.shape[1])


def make_media(
    fmt: str,
    *,
    seconds: float = 2.0,
    video: VideoSpec | None = None,
    audio: Sequence[AudioSpec] = (),
    cover_art: bool = False,
) -> bytes:
    """A file of container `fmt` (FFmpeg's muxer name) with at most one video stream
    and any number of audio streams, interleaved as a muxer expects; `cover_art` adds
    an album picture (an 'attached picture' video stream, as mp3 and flac carry)."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as container:
        packets: list[tuple[float, av.Packet]] = []
        if video is not None:
            packets += _video_packets(container, video, seconds)
        for spec in audio:
            packets += _audio_packets(container, spec, seconds)
        if cover_art:
            picture = container.add_stream("png", rate=1)
            picture.width, picture.height, picture.pix_fmt = 16, 16, "rgb24"
            picture.disposition = Disposition.attached_pic
            image = np.zeros((16, 16, 3), dtype=np.uint8)
            for packet in picture.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        # Muxers want packets roughly in time order across streams.
        for _, packet in sorted(packets, key=lambda p: p[0]):
            container.mux(packet)
    return buf.getvalue()


def _video_packets(container: av.container.OutputContainer, spec: VideoSpec,
                   seconds: float) -> list[tuple[float, av.Packet]]:  # fmt: skip
    stream = container.add_stream(spec.codec, rate=spec.fps)
    stream.width, stream.height, stream.pix_fmt = spec.width, spec.height, spec.pix_fmt
    if spec.rotation:
        stream.set_display_rotation(-spec.rotation)  # PyAV counts counter-clockwise
    times = spec.frame_times or tuple(k / spec.fps for k in range(round(seconds * spec.fps)))
    time_base = Fraction(1, 1000) if spec.frame_times else Fraction(1, spec.fps)
    stream.codec_context.time_base = time_base
    out = []
    for t in times:
        image = np.zeros((spec.height, spec.width, 3), dtype=np.uint8)
        if any(abs(t + spec.start_s - e) < 1e-6 for e in spec.events):
            image[:] = 255
        image[: spec.height // 4, : spec.width // 4] = (255, 0, 0)
        frame = av.VideoFrame.from_ndarray(image, format="rgb24")
        frame.pts = round((t + spec.start_s) / time_base)
        frame.time_base = time_base
        out += [(_when(p), p) for p in stream.encode(frame)]
    out += [(_when(p), p) for p in stream.encode(None)]
    return out


def _audio_packets(container: av.container.OutputContainer, spec: AudioSpec,
                   seconds: float) -> list[tuple[float, av.Packet]]:  # fmt: skip
    stream = container.add_stream(spec.codec, rate=spec.rate, options=spec.options)
    stream.layout = spec.layout
    channels = stream.codec_context.layout.nb_channels
    n = round(seconds * spec.rate)
    t = np.arange(n) / spec.rate
    wave = 0.1 * np.sin(2 * np.pi * spec.freq * t) if spec.freq else np.zeros(n)
    for e in spec.events:
        at = round((e - spec.start_s) * spec.rate)
        if 0 <= at < n:
            wave[at : at + spec.rate // 1000] = 0.9  # 1 ms
    block = np.ascontiguousarray(np.tile(wave.astype(np.float32), (channels, 1)))
    start = round(spec.start_s * spec.rate)
    out = []
    step = 1024
    for i in range(0, n, step):
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(block[:, i : i + step]), format="fltp", layout=spec.layout
        )
        frame.sample_rate = spec.rate
        frame.pts = start + i
        frame.time_base = Fraction(1, spec.rate)
        out += [(_when(p), p) for p in stream.encode(frame)]
    out += [(_when(p), p) for p in stream.encode(None)]
    return out


def truncated(data: bytes) -> bytes:
    """The first 60% of a file: a download cut short."""
    return data[: len(data) * 3 // 5]


def garbage(size: int = 4000, seed: int = 0) -> bytes:
    """Random bytes, to save under a media extension."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def _when(packet: av.Packet) -> float:
    """Decode time: the order a muxer wants packets in (pts is out of order with B-frames)."""
    ts = packet.dts if packet.dts is not None else packet.pts
    return float(ts * packet.time_base) if ts is not None and packet.time_base else 0.0
