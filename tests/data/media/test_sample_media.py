"""stoker/data/media/sample_media.py on real media: the mp4 decodes (PyAV) to the frames,
colours, tone and timing it was made from, and the same input gives the same bytes; the
WAV reads back (soundfile) to its samples; the contact sheet is a PNG of the size its
docstring gives, each row showing its clip; bad arrays are refused with their fix.

Small clips (12 frames of 64x48, 0.5 s of 16 kHz audio): the suite runs on 2 busy cores.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

import av
import numpy as np
import pytest
import soundfile as sf
import torch

from stoker.data.media.sample_media import (
    AAC_FRAME,
    SHEET_BACKGROUND,
    SHEET_GAP,
    contact_sheet,
    encode_av_clip,
    encode_wav,
)
from tests.data.media_files import dominant_hz

FPS = 24
RATE = 16000
T, H, W = 12, 48, 64
# One flat colour per frame, all different: a frame out of order shows.
COLOURS = np.array([(40 + 15 * i, 200 - 12 * i, (90 * i) % 256) for i in range(T)], np.uint8)
ONSET_S = 0.25  # the tone starts here, after silence


def frames(colours: np.ndarray = COLOURS, height: int = H, width: int = W) -> np.ndarray:
    """[T, 3, H, W] uint8, frame i all colours[i]."""
    return np.ascontiguousarray(
        np.broadcast_to(colours[:, :, None, None], (len(colours), 3, height, width))
    )


def tones(*hz: float, seconds: float = T / FPS, onset_s: float = ONSET_S) -> np.ndarray:
    """[C, N] float32: a 0.5 sine of hz[c] in channel c, silent before `onset_s`."""
    t = np.arange(round(seconds * RATE)) / RATE
    wave = np.stack([0.5 * np.sin(2 * np.pi * f * t) for f in hz]) * (t >= onset_s)
    return wave.astype(np.float32)


def decoded(data: bytes) -> dict[str, Any]:
    """What PyAV reads from an mp4: its streams' facts, the frames (RGB), the audio."""
    with av.open(io.BytesIO(data)) as container:
        facts: dict[str, Any] = {
            "streams": [(s.type, s.codec_context.name) for s in container.streams],
            "video": [
                (v.width, v.height, v.average_rate, float(v.duration * v.time_base), v.start_time)
                for v in container.streams.video
            ],
            "audio": [
                (a.sample_rate, a.channels, float(a.duration * a.time_base), a.start_time)
                for a in container.streams.audio
            ],
        }
        facts["frames"] = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    if facts["audio"]:
        with av.open(io.BytesIO(data)) as container:
            audio = [f.to_ndarray() for f in container.decode(audio=0)]
        facts["samples"] = np.concatenate(audio, axis=1)
    return facts


@pytest.fixture(scope="module")
def stereo_clip() -> bytes:
    return encode_av_clip(frames(), tones(440, 1000), fps=FPS, sample_rate=RATE)


@pytest.mark.parametrize("channels", [1, 2])
def test_the_mp4_holds_one_h264_and_one_aac_stream_of_the_given_shape_and_length(
    channels: int,
) -> None:
    audio = tones(440, 1000)[:channels]
    data = encode_av_clip(frames(), audio, fps=FPS, sample_rate=RATE)
    got = decoded(data)
    assert got["streams"] == [("video", "h264"), ("audio", "aac")]
    [(width, height, rate, video_s, video_start)] = got["video"]
    assert (width, height, rate, video_start) == (W, H, FPS, 0)
    assert len(got["frames"]) == T
    assert abs(video_s - T / FPS) < 1 / FPS
    [(sample_rate, got_channels, audio_s, audio_start)] = got["audio"]
    assert (sample_rate, got_channels, audio_start) == (RATE, channels, 0)
    n = audio.shape[1]
    assert abs(audio_s - n / RATE) < AAC_FRAME / RATE
    # The encoder's priming is skipped; its padding of the last frame is not.
    assert n <= got["samples"].shape[1] < n + AAC_FRAME


def test_frames_decode_to_their_colours_in_order(stereo_clip: bytes) -> None:
    got = np.stack(decoded(stereo_clip)["frames"]).astype(int)  # [T, H, W, 3]
    # Lossy H.264 in yuv420p: flat colours come back within a few levels.
    error = np.abs(got - COLOURS[:, None, None, :].astype(int)).max()
    assert error <= 6, error


def test_each_channel_decodes_to_its_tone_starting_on_time(stereo_clip: bytes) -> None:
    samples = decoded(stereo_clip)["samples"]
    tone = samples[:, round((ONSET_S + 0.02) * RATE) :]
    # Frequency resolution of the ~0.23 s left after the onset: 4.4 Hz.
    assert dominant_hz(tone[:1], RATE) == pytest.approx(440, abs=5)
    assert dominant_hz(tone[1:], RATE) == pytest.approx(1000, abs=5)
    # Audio and video share time 0: the tone starts where it was put, within 2 ms (the
    # sine passes 0.2 in 0.15 ms; measured 0.125 ms late here).
    onset = np.argmax(np.abs(samples).max(axis=0) > 0.2) / RATE
    assert abs(onset - ONSET_S) < 0.002, onset


def test_the_same_input_gives_the_same_bytes(stereo_clip: bytes) -> None:
    again = encode_av_clip(frames(), tones(440, 1000), fps=FPS, sample_rate=RATE)
    assert again == stereo_clip
    as_torch = encode_av_clip(
        torch.from_numpy(frames()), torch.from_numpy(tones(440, 1000)), fps=FPS, sample_rate=RATE
    )
    assert as_torch == stereo_clip
    assert encode_av_clip(frames(), tones(440, 1001), fps=FPS, sample_rate=RATE) != stereo_clip


def test_video_alone_gives_an_mp4_without_audio() -> None:
    got = decoded(encode_av_clip(frames(), None, fps=Fraction(25), sample_rate=None))
    assert got["streams"] == [("video", "h264")]
    assert len(got["frames"]) == T and got["video"][0][2] == 25


@pytest.mark.parametrize(
    ("video", "audio", "sample_rate", "words"),
    [
        (frames(height=33), None, None, ["33x64", "even", "fix: crop or pad"]),
        (
            frames().transpose(0, 2, 3, 1),
            None,
            None,
            ["(12, 48, 64, 3)", "[T, 3, H, W]", "permute"],
        ),
        (frames()[0], None, None, ["(3, 48, 64)", "[T, 3, H, W]"]),
        (frames().astype(np.float32) / 255, None, None, ["float32", "uint8", "fix:"]),
        (frames(), tones(440).astype(np.int16), RATE, ["int16", "float", "/ 32768"]),
        (frames(), tones(440)[0], RATE, [f"({T * RATE // FPS},)", "audio[None]"]),
        (frames(), tones(440, 1000, 220), RATE, ["(3, 8000)", "C = 1 or 2", "mixed down"]),
        (frames(), tones(440), 12345, ["12345", "fix: resample", "16000"]),
        (None, tones(440), RATE, ["video is None", "encode_wav"]),
    ],
    ids=[
        "odd-height",
        "channels-last",
        "no-time-axis",
        "float-video",
        "int-audio",
        "1d-audio",
        "3-channels",
        "aac-rate",
        "audio-alone",
    ],
)
def test_bad_input_names_the_value_and_the_fix(
    video: Any, audio: Any, sample_rate: int | None, words: list[str]
) -> None:
    with pytest.raises(ValueError) as raised:
        encode_av_clip(video, audio, fps=FPS, sample_rate=sample_rate)
    for word in words:
        assert word in str(raised.value), (word, str(raised.value))


def test_the_wav_reads_back_to_its_samples_clipped() -> None:
    audio = tones(440, 1000)
    audio[0, :3] = (1.5, -2.0, np.nan)
    data = encode_wav(audio, sample_rate=RATE)
    assert encode_wav(audio, sample_rate=RATE) == data
    samples, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and sf.info(io.BytesIO(data)).subtype == "PCM_16"
    expected = np.clip(np.nan_to_num(audio), -1, 1).T
    assert samples.shape == expected.shape
    assert np.abs(samples - expected).max() <= 1.5 / 32768  # 16-bit steps


def png_pixels(data: bytes) -> np.ndarray:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    with av.open(io.BytesIO(data)) as container:
        image: np.ndarray = next(container.decode(video=0)).to_ndarray(format="rgb24")
    return image


def test_the_contact_sheet_has_a_row_per_clip_showing_its_frames_and_sound() -> None:
    red, blue = np.array([(220, 20, 20)] * 8, np.uint8), np.array([(20, 20, 220)] * 8, np.uint8)
    clips = [
        (frames(red, 32, 32), tones(440, seconds=0.5, onset_s=0)),
        (frames(blue, 32, 64), None),  # twice as wide: sets the frame column width
        (None, tones(2000, seconds=0.5, onset_s=0)),
    ]
    data = contact_sheet(clips, fps=16, sample_rate=RATE, frames_per_clip=3, row_height=40)
    sheet = png_pixels(data)
    frame_width, spectrogram_width = 80, 80  # 64 * 40 / 32; 2 * row_height
    assert sheet.shape == (
        SHEET_GAP + 3 * (40 + SHEET_GAP),
        SHEET_GAP + 3 * (frame_width + SHEET_GAP) + spectrogram_width + SHEET_GAP,
        3,
    )
    assert contact_sheet(clips, fps=16, sample_rate=RATE, frames_per_clip=3, row_height=40) == data

    def cell(row: int, left: int, width: int) -> np.ndarray:
        top = SHEET_GAP + row * (40 + SHEET_GAP)
        return sheet[top : top + 40, left : left + width].reshape(-1, 3).astype(int)

    spectrogram_x = SHEET_GAP + 3 * (frame_width + SHEET_GAP)
    for k in range(3):
        x = SHEET_GAP + k * (frame_width + SHEET_GAP)
        assert np.abs(cell(0, x, 40) - (220, 20, 20)).max() <= 2  # red, 40 px wide
        assert (cell(0, x + 40, 40) == SHEET_BACKGROUND).all()  # the rest of the column
        assert np.abs(cell(1, x, 80) - (20, 20, 220)).max() <= 2
        assert (cell(2, x, 80) == SHEET_BACKGROUND).all()  # no video
    no_audio = cell(1, spectrogram_x, spectrogram_width)[4 * spectrogram_width :]  # below ticks
    assert (no_audio == SHEET_BACKGROUND).all()

    def loudest_row(row: int) -> int:
        """The spectrogram's brightest line, counted from its bottom (low frequencies)."""
        top = SHEET_GAP + row * (40 + SHEET_GAP)
        panel = sheet[top + 10 : top + 40, spectrogram_x : spectrogram_x + spectrogram_width]
        return 39 - (10 + int(np.argmax(panel.astype(int).sum(axis=(1, 2)))))

    # 40 rows span 0-8 kHz: 440 Hz is in row 2, 2 kHz in row 10.
    assert loudest_row(0) == 2 and loudest_row(2) == 10


def test_torch_bfloat16_audio_is_taken_as_float32() -> None:
    audio = torch.from_numpy(tones(440)).to(torch.bfloat16)
    samples, _ = sf.read(io.BytesIO(encode_wav(audio, sample_rate=RATE)), dtype="float32")
    assert np.abs(samples - audio[0].float().numpy()).max() <= 1.5 / 32768  # mono: 1-D
