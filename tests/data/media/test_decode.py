"""The per-sample decoders on real encoded media made here.

Video: a 24 fps H.264 clip whose frame k shows k in binary as eight white or
black bars (top half) over a red bottom half, so every decoded frame says which
source frame it is, and RGB order and CHW layout show. Audio: sines, clicks and
silence through FLAC, WAV, Ogg Vorbis, MP3 and AAC in mp4.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import pytest
import soundfile as sf

from stoker.data.media.decode import clip_start, decode_audio, decode_video
from stoker.data.media.errors import MediaError
from stoker.data.media.h264_flac import encode_flac, encode_h264
from stoker.data.media.probe import probe_audio, probe_video

SOURCE_FPS = 24
FRAMES = 72  # 3 s
GOP = 24  # keyframes at frames 0, 24, 48
SIDE = 64


def _frame(k: int) -> np.ndarray:
    frame = np.zeros((SIDE, SIDE, 3), dtype=np.uint8)
    for bit in range(8):
        if (k >> bit) & 1:
            frame[: SIDE // 2, bit * 8 : (bit + 1) * 8] = 255
    frame[SIDE // 2 :, :, 0] = 255
    return frame


def _codes(video: np.ndarray) -> list[int]:
    """The source frame number each output frame shows (read from its bars)."""
    _, _, height, width = video.shape
    codes = []
    for frame in video:
        gray = frame.mean(axis=0)[: height // 2]
        bars = [gray[:, int((bit + 0.5) * width / 8)].mean() > 128 for bit in range(8)]
        codes.append(sum(1 << bit for bit, on in enumerate(bars) if on))
    return codes


def _expected(fps: float, start_s: float, count: int) -> list[int]:
    """Source frame on screen at start + i / fps: floor(t * 24), the last one past the end."""
    return [
        min(FRAMES - 1, math.floor((start_s + i / fps) * SOURCE_FPS + 1e-6)) for i in range(count)
    ]


@pytest.fixture(scope="module")
def mp4() -> bytes:
    frames = [_frame(k) for k in range(FRAMES)]
    return encode_h264(frames, fps=SOURCE_FPS, width=SIDE, height=SIDE, gop=GOP)


@pytest.fixture(scope="module")
def mkv(mp4: bytes) -> bytes:
    """The same stream remuxed into Matroska, whose pts are whole milliseconds
    (frame 1 is stamped 42 ms, after 1/24 s)."""
    buf = io.BytesIO()
    with av.open(io.BytesIO(mp4)) as src, av.open(buf, "w", format="matroska") as dst:
        stream = src.streams.video[0]
        out = dst.add_stream_from_template(stream)
        for packet in src.demux(stream):
            if packet.dts is None:
                continue
            packet.stream = out
            dst.mux(packet)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fps", "start_s", "clip_seconds"),
    [
        (8, 1.0, 1.0),  # frames 24, 27, 30, ...
        (8, 1.5, 1.0),  # starts mid-GOP: the seek goes back to frame 24
        (24, 5 / 24, 0.5),  # every frame, from a non-keyframe
        (10, 1.05, 0.6),  # a rate that does not divide 24
        (30, 0.2, 0.3),  # faster than the source: frames repeat
    ],
)
def test_video_picks_the_source_frame_on_screen(
    mp4: bytes, fps: float, start_s: float, clip_seconds: float
) -> None:
    video = decode_video(mp4, fps=fps, size=None, start_s=start_s, clip_seconds=clip_seconds)
    count = round(clip_seconds * fps)
    assert video.shape == (count, 3, SIDE, SIDE)
    assert video.dtype == np.uint8
    assert _codes(video) == _expected(fps, start_s, count)


def test_video_is_rgb_channels_first(mp4: bytes) -> None:
    video = decode_video(mp4, fps=8, size=None, start_s=0.0, clip_seconds=0.5)
    red = video[:, :, SIDE // 2 + 4 :, :].astype(int)  # the red bottom half, off its edge
    assert red[:, 0].min() > 230
    assert red[:, 1:].max() < 30
    assert video.flags.c_contiguous


def test_video_resizes_to_height_width(mp4: bytes) -> None:
    video = decode_video(mp4, fps=8, size=(32, 48), start_s=1.0, clip_seconds=1.0)
    assert video.shape == (8, 3, 32, 48)
    assert _codes(video) == _expected(8, 1.0, 8)
    assert video[:, 0, 20:].min() > 200  # still red below, at the new size


def test_video_past_the_end_repeats_the_last_frame(mp4: bytes) -> None:
    video = decode_video(mp4, fps=10, size=None, start_s=2.5, clip_seconds=1.0)
    assert _codes(video) == [60, 62, 64, 67, 69, 71, 71, 71, 71, 71]
    assert (video[5:] == video[5]).all()


def test_video_in_a_container_with_rounded_timestamps(mkv: bytes) -> None:
    # Frame k is stamped round(k * 1000 / 24) ms: up to 0.5 ms after its time.
    video = decode_video(mkv, fps=24, size=None, start_s=0.0, clip_seconds=1.0)
    assert _codes(video) == list(range(24))
    video = decode_video(mkv, fps=24, size=None, start_s=1.5, clip_seconds=0.5)
    assert _codes(video) == list(range(36, 48))


class _CountingContainer:
    """An av container that records the frames its decode() hands out."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.decoded: list[int] = []

    def __enter__(self) -> _CountingContainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def decode(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        for frame in self.real.decode(*args, **kwargs):
            self.decoded.append(round(frame.time * SOURCE_FPS))
            yield frame


def test_video_decodes_from_the_keyframe_to_the_last_needed_frame(
    mp4: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[_CountingContainer] = []
    real_open = av.open

    def counting_open(*args: Any, **kwargs: Any) -> _CountingContainer:
        opened.append(_CountingContainer(real_open(*args, **kwargs)))
        return opened[-1]

    monkeypatch.setattr(av, "open", counting_open)
    video = decode_video(mp4, fps=8, size=None, start_s=1.5, clip_seconds=0.5)
    assert _codes(video) == [36, 39, 42, 45]
    # From the keyframe before 1.5 s (frame 24), not from 0; and not past frame 45.
    assert opened[0].decoded == list(range(24, 46))


def test_video_shorter_than_its_index_says_is_truncated(mp4: bytes) -> None:
    info = probe_video(mp4, "mp4")
    padded = decode_video(mp4, fps=8, size=None, start_s=2.5, clip_seconds=1.0, info=info)
    assert _codes(padded)[-1] == FRAMES - 1
    longer = info.model_copy(update={"duration_s": 10.0, "frames": 240})
    with pytest.raises(MediaError, match="truncated"):
        decode_video(mp4, fps=8, size=None, start_s=2.5, clip_seconds=1.0, info=longer)


def test_video_that_does_not_decode_raises_media_error(mp4: bytes) -> None:
    flac = encode_flac(np.zeros(4410), sample_rate=44100)
    bad = {
        "garbage": b"\x00\x01garbage" * 500,
        "truncated mp4": mp4[: len(mp4) // 2],
        "empty": b"",
        "no video stream": flac,
    }
    for name, data in bad.items():
        with pytest.raises(MediaError):
            decode_video(data, fps=8, size=None, start_s=0.0, clip_seconds=1.0)
            pytest.fail(f"{name} decoded")


def test_video_rejects_arguments_that_give_no_frames(mp4: bytes) -> None:
    with pytest.raises(ValueError, match="at least one frame"):
        decode_video(mp4, fps=8, size=None, start_s=0.0, clip_seconds=0.01)
    with pytest.raises(ValueError, match="start_s"):
        decode_video(mp4, fps=8, size=None, start_s=-1.0, clip_seconds=1.0)


def test_clip_start_stays_inside_the_media() -> None:
    assert clip_start(10.0, 2.0, 0.0) == 0.0
    assert clip_start(10.0, 2.0, 0.5) == 4.0
    assert clip_start(10.0, 2.0, 0.999999) <= 8.0
    assert clip_start(1.0, 2.0, 0.7) == 0.0  # shorter than the clip: from the start
    with pytest.raises(ValueError, match="u must lie"):
        clip_start(10.0, 2.0, 1.0)


# --- audio -----------------------------------------------------------------------

RATE = 44100


def _sine(freq: float, seconds: float, amplitude: float = 0.5, rate: int = RATE) -> np.ndarray:
    return amplitude * np.sin(2 * np.pi * freq * np.arange(round(seconds * rate)) / rate)


def _encode(wave: np.ndarray, field: str, rate: int = RATE) -> bytes:
    if field == "mp4":  # AAC in mp4, through FFmpeg
        buf = io.BytesIO()
        with av.open(buf, "w", format="mp4") as container:
            stream = container.add_stream("aac", rate=rate, layout="mono")
            mono = wave.astype(np.float32)
            for i in range(0, len(mono), 1024):
                frame = av.AudioFrame.from_ndarray(
                    mono[None, i : i + 1024], format="fltp", layout="mono"
                )
                frame.sample_rate, frame.pts = rate, i
                for packet in stream.encode(frame):
                    container.mux(packet)
            for packet in stream.encode(None):
                container.mux(packet)
        return buf.getvalue()
    if field == "flac":
        return encode_flac(wave, sample_rate=rate)
    fmt, subtype = {"wav": ("WAV", "PCM_16"), "ogg": ("OGG", "VORBIS")}.get(
        field, ("MP3", "MPEG_LAYER_III")
    )
    buf = io.BytesIO()
    sf.write(buf, wave, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def test_audio_resamples_and_downmixes_a_sine() -> None:
    stereo = np.stack([_sine(440, 3.0, 0.6), _sine(440, 3.0, 0.2)], axis=1)
    flac = _encode(stereo, "flac")
    audio = decode_audio(
        flac, field="flac", sample_rate=16000, channels=1, start_s=0.5, clip_seconds=1.0
    )
    assert audio.shape == (1, 16000)
    assert audio.dtype == np.float32
    spectrum = np.abs(np.fft.rfft(audio[0]))
    assert np.argmax(spectrum) * 16000 / audio.shape[1] == pytest.approx(440, abs=1)
    # The average of the channels (0.4), not their sum (0.8) nor the left one (0.6).
    assert np.abs(audio).max() == pytest.approx(0.4, abs=0.01)


def test_audio_resampler_filters_what_the_new_rate_cannot_hold() -> None:
    # 10 kHz is above 16 kHz's Nyquist: a real resampler removes it, dropping
    # samples would fold it to 6 kHz at full strength.
    flac = _encode(_sine(10000, 1.0, 0.5), "flac")
    audio = decode_audio(
        flac, field="flac", sample_rate=16000, channels=1, start_s=0.2, clip_seconds=0.5
    )
    assert np.abs(audio).max() < 0.02


@pytest.mark.parametrize("field", ["flac", "wav", "ogg", "mp3", "mp4"])
@pytest.mark.parametrize("rate", [16000, 48000])
def test_audio_click_lands_on_its_sample(field: str, rate: int) -> None:
    click = np.zeros(3 * RATE)
    click[round(1.5 * RATE)] = 0.9
    data = _encode(click, field)
    audio = decode_audio(
        data, field=field, sample_rate=rate, channels=1, start_s=1.0, clip_seconds=1.0
    )
    assert audio.shape == (1, rate)
    assert abs(int(np.argmax(np.abs(audio[0]))) - rate // 2) <= 1  # 1.5 s - 1.0 s
    assert np.abs(audio).max() <= 1.0


def test_audio_at_the_source_rate_is_the_source_samples() -> None:
    wave = _sine(440, 2.0, 0.5, rate=16000)
    wav = _encode(wave, "wav", rate=16000)
    audio = decode_audio(
        wav, field="wav", sample_rate=16000, channels=1, start_s=0.25, clip_seconds=0.5
    )
    np.testing.assert_allclose(audio[0], wave[4000:12000], atol=1 / 32768)


def test_audio_upmixes_mono_by_repeating() -> None:
    flac = _encode(_sine(440, 1.0), "flac")
    audio = decode_audio(
        flac, field="flac", sample_rate=22050, channels=3, start_s=0.0, clip_seconds=0.5
    )
    assert audio.shape == (3, 11025)
    assert (audio[0] == audio[1]).all() and (audio[0] == audio[2]).all()
    assert np.abs(audio[0]).max() == pytest.approx(0.5, abs=0.01)


def test_audio_past_the_end_is_zero_padded_to_the_exact_length() -> None:
    flac = _encode(_sine(440, 3.0), "flac")
    audio = decode_audio(
        flac, field="flac", sample_rate=22050, channels=2, start_s=2.5, clip_seconds=0.77
    )
    assert audio.shape == (2, round(0.77 * 22050))
    assert np.abs(audio[:, : 11025 - 50]).max() > 0.45  # sound up to 3.0 s
    assert not audio[:, 11025 + 50 :].any()  # silence after
    beyond = decode_audio(
        flac, field="flac", sample_rate=16000, channels=1, start_s=5.0, clip_seconds=1.0
    )
    assert beyond.shape == (1, 16000) and not beyond.any()


def test_audio_shorter_than_its_index_says_is_truncated() -> None:
    wav = _encode(_sine(440, 3.0), "wav")
    info = probe_audio(wav, "wav")
    cut = wav[: len(wav) // 2]  # libsndfile reads the 1.5 s left as a whole file
    late = {"sample_rate": 16000, "channels": 1, "start_s": 2.0, "clip_seconds": 0.5}
    assert not decode_audio(cut, field="wav", **late).any()  # without the index: silence
    with pytest.raises(MediaError, match="truncated"):
        decode_audio(cut, field="wav", info=info, **late)
    intact = decode_audio(wav, field="wav", info=info, **late)
    assert np.abs(intact).max() > 0.45


def test_audio_that_does_not_decode_raises_media_error(mp4: bytes) -> None:
    flac = _encode(_sine(440, 1.0), "flac")
    bad = [
        (b"fLaC" + b"\x00\x07garbage" * 200, "flac"),
        (b"\x00\x01garbage" * 500, "wav"),
        (flac[: len(flac) // 3], "flac"),
        (b"", "flac"),
        (_encode(_sine(440, 1.0), "mp4")[:2000], "mp4"),
        (mp4, "mp4"),  # video only: no audio stream
    ]
    for data, field in bad:
        with pytest.raises(MediaError):
            decode_audio(
                data, field=field, sample_rate=16000, channels=1, start_s=0.0, clip_seconds=1.0
            )
            pytest.fail(f"{len(data)} bytes of {field} decoded")
