"""Files a person can watch and hear, made from a model's generated samples: one mp4
with H.264 video and AAC audio (`encode_av_clip`), a 16-bit WAV for audio-only models
(`encode_wav`), and one PNG that sets several samples side by side (`contact_sheet`).

Inputs are shaped as stoker's decoders return them: video uint8 [T, 3, H, W] (RGB),
audio float [C, N] in [-1, 1]; numpy arrays or torch tensors (any device).

The same inputs give the same bytes with the same FFmpeg and libsndfile builds: x264
runs with `mbtree=0` as in stoker/data/media/h264_flac.py, and FFmpeg's own `aac` encoder gave
one output in 40 encodes in one process and in 5 processes here (PyAV 18.1, libavcodec
62.28). Another build of x264 or FFmpeg, or another CPU's SIMD path, may give other
bytes.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from stoker.data.media.h264_flac import DEFAULT_GOP_SECONDS
from stoker.data.media.sample_arrays import audio_samples, frame_rate, video_frames

if TYPE_CHECKING:
    import numpy.typing as npt

# The rates AAC has a sampling-frequency index for (ISO 14496-3); FFmpeg's encoder
# refuses any other.
AAC_SAMPLE_RATES = (
    96000,
    88200,
    64000,
    48000,
    44100,
    32000,
    24000,
    22050,
    16000,
    12000,
    11025,
    8000,
    7350,
)
# FFmpeg's `aac` encoder takes 1024 samples a frame (the last one may be shorter).
AAC_FRAME = 1024
# Per channel: transparent enough to judge a sample by ear; under AAC's ceiling at
# 16 kHz (6144 bits a channel a frame: 96 kb/s), where FFmpeg would clamp and warn.
AAC_BITRATE_PER_CHANNEL = 64_000
# Generated samples are judged by eye, so a little better than encode_h264's default.
SAMPLE_CRF = 20

# The contact sheet: pixels between cells, the colour of what a clip lacks, the level
# shown black (0 dB is a full-scale sine), and a colour map (dark to bright: magma's
# stops) a spectrogram's levels are drawn with.
SHEET_GAP = 4
SHEET_BACKGROUND = (40, 40, 40)
SPECTROGRAM_FLOOR_DB = -80.0
_COLOUR_STOPS = np.array(
    [(0, 0, 4), (81, 18, 124), (183, 55, 121), (252, 137, 97), (252, 253, 191)], dtype=np.float64
)


def encode_av_clip(
    video: Any, audio: Any, *, fps: float | Fraction, sample_rate: int | None = None
) -> bytes:
    """One mp4: H.264 (yuv420p) from `video` uint8 [T, 3, H, W] RGB, H and W even,
    and AAC from `audio` float [C, N] (C = 1 or 2), both starting at 0 and lasting
    T / fps and N / sample_rate seconds. Either may be None (for audio alone, use
    `encode_wav`); `sample_rate` is needed with audio and must be one AAC has
    (`AAC_SAMPLE_RATES`). Audio is clipped to [-1, 1], NaN becomes silence.

    Raises ValueError for inputs of the wrong shape, dtype or size, naming the fix.
    """
    if video is None and audio is None:
        raise ValueError("encode_av_clip: video and audio are both None; pass at least one")
    if video is None:
        raise ValueError(
            "encode_av_clip: video is None; fix: encode_wav(audio, sample_rate=...) "
            "writes audio alone"
        )
    rate = frame_rate(fps)
    frames = video_frames(video)
    _, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise ValueError(
            f"encode_av_clip: H.264 yuv420p needs an even height and width, got "
            f"{height}x{width}; fix: crop or pad the frames, e.g. "
            "video[..., : H // 2 * 2, : W // 2 * 2]"
        )
    samples = None
    if audio is not None:
        if sample_rate not in AAC_SAMPLE_RATES:
            raise ValueError(
                f"encode_av_clip: AAC has no sample rate {sample_rate}; fix: resample "
                f"to one of {', '.join(map(str, AAC_SAMPLE_RATES))}"
            )
        samples = audio_samples(audio)
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        # (decode time in seconds, stream index, packet): muxed in time order, video
        # first at a tie, so the file does not depend on the muxer's buffering.
        packets = _video_packets(container, frames, rate)
        if samples is not None:
            assert sample_rate is not None  # checked above
            packets += _audio_packets(container, samples, sample_rate)
        for _, _, packet in sorted(packets, key=lambda p: (p[0], p[1])):
            container.mux(packet)
    return buf.getvalue()


def encode_wav(audio: Any, *, sample_rate: int) -> bytes:
    """A 16-bit PCM WAV from `audio` float [C, N] (C = 1 or 2) in [-1, 1]; values
    beyond are clipped, NaN becomes silence."""
    if sample_rate < 1:
        raise ValueError(f"encode_wav: sample_rate must be a positive integer, got {sample_rate}")
    samples = audio_samples(audio)
    import soundfile as sf

    buf = io.BytesIO()
    sf.write(buf, samples.T, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def _video_packets(
    container: Any, frames: npt.NDArray[np.uint8], fps: Fraction
) -> list[tuple[float, int, Any]]:
    """The H.264 packets of `frames`, options as stoker/data/media/h264_flac.py's encode_h264."""
    import av

    count, height, width, _ = frames.shape
    gop = max(1, round(fps * DEFAULT_GOP_SECONDS))
    stream = container.add_stream("libx264", rate=fps)
    stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
    stream.codec_context.time_base = 1 / fps
    stream.codec_context.gop_size = gop
    stream.options = {
        "preset": "veryfast",
        "crf": str(SAMPLE_CRF),
        # mbtree=0 makes x264 deterministic (see encode_h264); fixed keyframes.
        "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:mbtree=0",
    }
    packets = []
    for i in range(count):
        frame = av.VideoFrame.from_ndarray(frames[i], format="rgb24")
        frame.pts = i
        frame.time_base = stream.codec_context.time_base
        packets += stream.encode(frame)
    packets += stream.encode(None)
    return [(_decode_time(p), 0, p) for p in packets]


def _audio_packets(
    container: Any, samples: npt.NDArray[np.float32], sample_rate: int
) -> list[tuple[float, int, Any]]:
    import av

    layout = "mono" if samples.shape[0] == 1 else "stereo"
    stream = container.add_stream("aac", rate=sample_rate)
    stream.layout = layout
    stream.codec_context.bit_rate = AAC_BITRATE_PER_CHANNEL * samples.shape[0]
    time_base = Fraction(1, sample_rate)
    packets = []
    for start in range(0, samples.shape[1], AAC_FRAME):
        block = np.ascontiguousarray(samples[:, start : start + AAC_FRAME])
        frame = av.AudioFrame.from_ndarray(block, format="fltp", layout=layout)
        frame.sample_rate = sample_rate
        frame.pts = start
        frame.time_base = time_base
        packets += stream.encode(frame)
    packets += stream.encode(None)
    return [(_decode_time(p), 1, p) for p in packets]


def _decode_time(packet: Any) -> float:
    """When a packet is decoded: the order a muxer wants (B-frames put pts out of order)."""
    ts = packet.dts if packet.dts is not None else packet.pts
    return float(ts * packet.time_base) if ts is not None and packet.time_base else 0.0


def contact_sheet(
    clips: list[tuple[Any, Any]],
    *,
    fps: float | Fraction,
    sample_rate: int,
    frames_per_clip: int = 4,
    row_height: int = 96,
    spectrogram_width: int | None = None,
) -> bytes:
    """One PNG comparing `clips`, each (video or None, audio or None) shaped as for
    `encode_av_clip` (any size), at a glance: a row per clip, in order, with
    `frames_per_clip` frames evenly spaced from the first to the last, then the
    log-magnitude spectrogram of its audio (channels averaged; low frequencies at the
    bottom; SPECTROGRAM_FLOOR_DB to 0 dB, a full-scale sine, dark to bright; time on
    one scale for every row, the longest clip filling the width), ticked at the top at
    the times of the frames shown. No labels: rows follow the order of `clips`.

    Frames are scaled to `row_height` (nearest pixel), keeping their aspect ratio. The
    sheet is SHEET_GAP + rows * (row_height + SHEET_GAP) pixels high and SHEET_GAP +
    frames_per_clip * (frame_width + SHEET_GAP) + spectrogram_width + SHEET_GAP wide,
    frame_width being the widest scaled frame and spectrogram_width 2 * row_height by
    default; the frames are left out when no clip has video, the spectrogram when
    none has audio. What a clip lacks stays SHEET_BACKGROUND.
    """
    rate = frame_rate(fps)
    spectrogram_width = spectrogram_width or 2 * row_height
    if not clips or min(frames_per_clip, row_height, spectrogram_width, sample_rate) < 1:
        raise ValueError(
            f"contact_sheet: needs clips (got {len(clips)}) and positive frames_per_clip "
            f"({frames_per_clip}), row_height ({row_height}), spectrogram_width "
            f"({spectrogram_width}) and sample_rate ({sample_rate})"
        )
    rows = [
        (None if v is None else video_frames(v), None if a is None else audio_samples(a))
        for v, a in clips
    ]
    frame_width = max(
        (max(1, round(v.shape[2] * row_height / v.shape[1])) for v, _ in rows if v is not None),
        default=0,
    )
    span_s = max(
        max(0.0 if v is None else len(v) / rate, 0.0 if a is None else a.shape[1] / sample_rate)
        for v, a in rows
    )
    frames_x = SHEET_GAP
    spectrogram_x = frames_x + (frames_per_clip * (frame_width + SHEET_GAP) if frame_width else 0)
    has_audio = any(a is not None for _, a in rows)
    width = spectrogram_x + (spectrogram_width + SHEET_GAP if has_audio else 0)
    height = SHEET_GAP + len(rows) * (row_height + SHEET_GAP)
    sheet = np.empty((height, width, 3), dtype=np.uint8)
    sheet[:] = SHEET_BACKGROUND
    for row, (video, audio) in enumerate(rows):
        top = SHEET_GAP + row * (row_height + SHEET_GAP)
        shown: list[int] = []
        if video is not None:
            shown = np.linspace(0, len(video) - 1, frames_per_clip).round().astype(int).tolist()
            for k, i in enumerate(shown):
                tile = _scaled(
                    video[i], row_height, round(video.shape[2] * row_height / video.shape[1])
                )
                left = frames_x + k * (frame_width + SHEET_GAP)
                sheet[top : top + row_height, left : left + tile.shape[1]] = tile
        if not has_audio:
            continue
        panel = sheet[top : top + row_height, spectrogram_x : spectrogram_x + spectrogram_width]
        if audio is not None:
            columns = max(1, round(audio.shape[1] / sample_rate / span_s * spectrogram_width))
            panel[:, :columns] = _spectrogram_image(audio, sample_rate, row_height, columns)
        for i in shown:  # where in the audio each frame shown is
            x = min(spectrogram_width - 1, int(i / rate / span_s * spectrogram_width))
            panel[: max(2, row_height // 12), x] = 255
    return _png(sheet)


def _scaled(image: npt.NDArray[np.uint8], height: int, width: int) -> npt.NDArray[np.uint8]:
    """`image` [H, W, 3] at (height, width), nearest pixel."""
    rows = np.arange(height) * image.shape[0] // height
    cols = np.arange(max(1, width)) * image.shape[1] // max(1, width)
    scaled: npt.NDArray[np.uint8] = image[rows][:, cols]
    return scaled


def _spectrogram_image(
    audio: npt.NDArray[np.float32], sample_rate: int, height: int, width: int
) -> npt.NDArray[np.uint8]:
    """The log-magnitude spectrogram of `audio` [C, N] as RGB [height, width, 3]."""
    n_fft = 512 if sample_rate <= 24000 else 1024  # 21-32 ms windows at common rates
    hop = n_fft // 4
    mono = np.pad(audio.astype(np.float64).mean(axis=0), n_fft // 2)  # frames centred
    mono = np.pad(mono, (0, max(0, n_fft - len(mono))))
    starts = hop * np.arange(1 + (len(mono) - n_fft) // hop)
    window = np.hanning(n_fft)
    magnitude = np.abs(np.fft.rfft(mono[starts[:, None] + np.arange(n_fft)] * window, axis=1))
    # A full-scale sine peaks at sum(window) / 2: that is 0 dB.
    db = 20 * np.log10(np.maximum(magnitude.T / (window.sum() / 2), 1e-12))  # [freq, time]
    # Shrinking keeps each pixel's loudest bin and frame (a pure tone spans ~4 bins, and
    # stepping over bins could miss its peak); growing repeats them.
    db = _max_pool(_max_pool(db, height, axis=0)[::-1], width, axis=1)
    level = np.clip(1 - db / SPECTROGRAM_FLOOR_DB, 0.0, 1.0)
    stops = np.linspace(0.0, 1.0, len(_COLOUR_STOPS))
    rgb = [np.interp(level, stops, _COLOUR_STOPS[:, c]) for c in range(3)]
    image: npt.NDArray[np.uint8] = np.stack(rgb, axis=-1).round().astype(np.uint8)
    return image


def _max_pool(values: npt.NDArray[np.float64], size: int, *, axis: int) -> npt.NDArray[np.float64]:
    """`values` resized to `size` along `axis`, each output the maximum of its span."""
    edges = np.arange(size) * values.shape[axis] // size
    return np.maximum.reduceat(values, edges, axis=axis)


def _png(image: npt.NDArray[np.uint8]) -> bytes:
    """A PNG of `image` [H, W, 3] RGB (FFmpeg's PNG encoder: one packet, the whole file)."""
    import av

    codec = av.CodecContext.create("png", "w")
    codec.width, codec.height, codec.pix_fmt = image.shape[1], image.shape[0], "rgb24"
    packets = codec.encode(av.VideoFrame.from_ndarray(image, format="rgb24"))
    packets += codec.encode(None)
    return b"".join(bytes(p) for p in packets)
