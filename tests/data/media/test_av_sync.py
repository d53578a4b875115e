"""Audio and video of one clip start at the same instant.

Each clip has a white frame among black ones and a click in quiet audio at the same
times (0.5 s and 1.25 s). After `decode_video` and `decode_audio` with the same
`start_s`, the white frame's time (index / fps) and the click's (sample /
sample_rate) must agree within one video frame: through AAC's encoder priming,
streams that start at other timestamps, seeks, and the packer's clip cutting.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.data.media.decode import decode_audio, decode_video
from stoker.data.media.probe import probe_media
from stoker.data.pack.pipeline import PackRequest, run_pack
from stoker.data.pack.plan import PackOptions
from tests.data.media_files import (
    EVENTS,
    AudioSpec,
    VideoSpec,
    clicks,
    make_media,
    white_frames,
)

FPS = 24
RATE = 16_000
FRAME_S = 1 / FPS

CLIPS = {
    # The case the issue names: H.264 + AAC (1024 samples of priming) in mp4.
    "mp4": ("mp4", VideoSpec(), [AudioSpec()]),
    # The audio starts 0.3 s after the picture: the mp4 edit list delays it.
    "mp4 late audio": ("mp4", VideoSpec(), [AudioSpec(start_s=0.3)]),
    # The picture starts 0.25 s after the audio.
    "mkv late video": ("matroska", VideoSpec(start_s=0.25), [AudioSpec()]),
    "webm": ("webm", VideoSpec(codec="libvpx-vp9"), [AudioSpec(codec="libopus")]),
    "mov": ("mov", VideoSpec(codec="mjpeg", pix_fmt="yuvj420p"), [AudioSpec(codec="pcm_s16le")]),
    # MPEG-TS starts both streams at arbitrary, different timestamps and seeks by bytes.
    "ts": ("mpegts", VideoSpec(), [AudioSpec()]),
    # A variable frame rate: the white frames show for 50 ms only.
    "mp4 vfr": (
        "mp4",
        VideoSpec(frame_times=(0, 0.1, 0.15, 0.5, 0.55, 0.9, 1.25, 1.3, 1.9)),
        [AudioSpec()],
    ),
}


@pytest.fixture(scope="module")
def clips() -> dict[str, tuple[str, bytes]]:
    """name -> (member extension, bytes)."""
    ext = {"matroska": "mkv", "mpegts": "ts"}
    return {
        name: (ext.get(fmt, fmt), make_media(fmt, video=video, audio=audio))
        for name, (fmt, video, audio) in CLIPS.items()
    }


def _event_times(data: bytes, ext: str, start_s: float) -> tuple[list[float], list[float]]:
    """(times of the white frames, times of the clicks) in the container's time."""
    probe = probe_media(data, ext)
    assert probe.video is not None and probe.audio is not None
    seconds = 1.0
    video = decode_video(
        data, fps=FPS, size=(24, 32), start_s=start_s, clip_seconds=seconds, info=probe.video
    )
    audio = decode_audio(
        data,
        field=ext,
        sample_rate=RATE,
        channels=1,
        start_s=start_s,
        clip_seconds=seconds,
        info=probe.audio,
    )
    flashes = [start_s + i / FPS for i in white_frames(video)]
    # One white frame shows for a frame period: keep the first of each run.
    firsts = [t for t in flashes if not any(0 < t - u <= FRAME_S + 1e-9 for u in flashes)]
    return firsts, [start_s + t for t in clicks(audio, RATE)]


@pytest.mark.parametrize("name", list(CLIPS))
@pytest.mark.parametrize("start_s", [0.0, 0.4, 0.9])
def test_white_frame_and_click_agree(
    clips: dict[str, tuple[str, bytes]], name: str, start_s: float
) -> None:
    ext, data = clips[name]
    flashes, sounds = _event_times(data, ext, start_s)
    video_start = CLIPS[name][1].start_s
    # Which events fall inside the clip, in the container's time (from its first frame).
    expected = [e - video_start for e in EVENTS if start_s <= e - video_start < start_s + 1.0]
    assert len(flashes) == len(sounds) == len(expected), (flashes, sounds, expected)
    for flash, sound, event in zip(flashes, sounds, expected, strict=True):
        assert abs(flash - sound) < FRAME_S, (name, start_s, flash, sound)
        assert abs(sound - event) < 2e-3, (name, start_s, sound, event)


def test_packed_clips_keep_sync(tmp_path: Path) -> None:
    """--clip-seconds cuts video and audio at the same instants: the audio track of an
    mp4 that starts late, and an audio file beside a video (taken to start with it)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "late.mp4").write_bytes(
        make_media("mp4", video=VideoSpec(), audio=[AudioSpec(start_s=0.3)])
    )
    (src / "pair.mkv").write_bytes(make_media("matroska", video=VideoSpec()))
    (src / "pair.wav").write_bytes(make_media("wav", audio=[AudioSpec(codec="pcm_s16le")]))
    dst = tmp_path / "dst"
    report = run_pack(PackRequest(str(src), str(dst), PackOptions(clip_seconds=1.0), workers=1))
    assert report.skipped == [] and report.samples == 4
    from stoker.data.format.shard_format import parse_index

    index = parse_index((dst / "shards/shard-000000.index.json").read_bytes(), "index")
    raw = (dst / "shards/shard-000000.tar").read_bytes()
    for entry in index.samples:
        assert entry.video is not None and entry.audio is not None
        assert (entry.video.field, entry.audio.field) == ("mp4", "flac")
        member = {e: raw[m.offset : m.offset + m.size] for e, m in entry.members.items()}
        clip_index = int(entry.key.rsplit("_c", 1)[1])
        video = decode_video(member["mp4"], fps=FPS, size=None, start_s=0.0, clip_seconds=1.0)
        audio = decode_audio(
            member["flac"], field="flac", sample_rate=RATE, channels=1, start_s=0.0,
            clip_seconds=1.0,
        )  # fmt: skip
        flashes = [i / FPS for i in white_frames(video)]
        sounds = clicks(audio, RATE)
        expected = [e - clip_index for e in EVENTS if clip_index <= e < clip_index + 1]
        assert [round(t * FPS) for t in flashes] == [round(e * FPS) for e in expected]
        assert len(sounds) == len(expected), (entry.key, sounds)
        for sound, event in zip(sounds, expected, strict=True):
            assert abs(sound - event) < 2e-3, (entry.key, sound, event)
