"""`stoker data pack` on the formats of real-world media, made here with PyAV: what
each file gives its sample (video, audio in the video, audio files), the facts the
index records, decoding, the loader, `--audio-stream`, and the report of every
file left out (with its kind and a count per kind). Broken files never fail a pack.
"""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from stoker.data.format.shard_format import SampleEntry, parse_index
from stoker.data.media.decode import decode_audio, decode_video
from tests.clirun import stoker_text
from tests.data.media_files import (
    AudioSpec,
    VideoSpec,
    dominant_hz,
    garbage,
    make_media,
    truncated,
)

SECONDS = 1.0
H264_AAC = {"video": VideoSpec(), "audio": [AudioSpec()]}


def _media(fmt: str, **kw: Any) -> bytes:
    return make_media(fmt, seconds=SECONDS, **kw)


def _png() -> bytes:
    buf = io.BytesIO()
    with av.open(buf, "w", format="image2pipe") as container:
        stream = container.add_stream("png", rate=1)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "rgb24"
        image = np.zeros((48, 64, 3), dtype=np.uint8)
        for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
            container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return buf.getvalue()


# key -> (display width, height, rotation) of its video, or None.
VIDEO = {
    "webm_vp9": (64, 48, 0),
    "h264_aac": (64, 48, 0),
    "mjpeg": (64, 48, 0),
    "two_tracks": (64, 48, 0),
    "phone/portrait": (48, 64, 90),
    "upside_down": (64, 48, 180),
    "vfr": (64, 48, 0),
    "h264": (64, 48, 0),
    "mjpeg_pcm": (64, 48, 0),
    "broadcast": (64, 48, 0),
    "dvd": (64, 48, 0),
    "pair": (64, 48, 0),
}
# key -> (member, codec, sample rate, channels, stream) of its audio, or missing.
AUDIO = {
    "webm_vp9": ("webm", "opus", 48000, 1, 0),
    "h264_aac": ("mp4", "aac", 48000, 1, 0),
    "two_tracks": ("mkv", "aac", 48000, 1, 0),
    "phone/portrait": ("mp4", "aac", 48000, 2, 0),
    "h264": ("m4v", "aac", 44100, 1, 0),
    "mjpeg_pcm": ("avi", "pcm_s16le", 32000, 1, 0),
    "broadcast": ("ts", "aac", 48000, 1, 0),
    "dvd": ("mpg", "mp2", 48000, 1, 0),
    "pair": ("flac", "flac", 16000, 1, 0),  # the audio file wins over the mp4's track
    "music": ("m4a", "aac", 48000, 6, 0),
    "voice": ("opus", "opus", 48000, 1, 0),
    "ambience": ("oga", "ogg", 44100, 2, 0),
    "song": ("mp3", "mp3", 44100, 1, 0),
    "raw": ("aac", "aac", 8000, 1, 0),
    "take": ("aiff", "aiff", 22050, 2, 0),
    "narrow": ("wav", "wav", 8000, 1, 0),
    "surround": ("flac", "flac", 48000, 6, 0),
    "extra": ("mka", "flac", 24000, 1, 0),  # an extension no list names: probed
}


def good_files() -> dict[str, bytes]:
    return {
        "webm_vp9.webm": _media(
            "webm", video=VideoSpec(codec="libvpx-vp9"), audio=[AudioSpec(codec="libopus")]
        ),
        "h264_aac.mp4": _media("mp4", **H264_AAC),
        "mjpeg.mov": _media("mov", video=VideoSpec(codec="mjpeg", pix_fmt="yuvj420p")),
        "two_tracks.mkv": _media(
            "matroska", video=VideoSpec(), audio=[AudioSpec(), AudioSpec(freq=1000)]
        ),
        # A phone held upright: landscape frames, turned 90 degrees clockwise to show.
        "phone/portrait.mp4": _media(
            "mp4", video=VideoSpec(rotation=90), audio=[AudioSpec(layout="stereo")]
        ),
        "upside_down.mkv": _media("matroska", video=VideoSpec(rotation=180)),
        "vfr.mp4": _media("mp4", video=VideoSpec(frame_times=(0, 0.1, 0.15, 0.5, 0.55, 0.9))),
        "h264.m4v": _media("mp4", video=VideoSpec(), audio=[AudioSpec(rate=44100)]),
        "mjpeg_pcm.avi": _media(
            "avi",
            video=VideoSpec(codec="mjpeg", pix_fmt="yuvj420p"),
            audio=[AudioSpec(codec="pcm_s16le", rate=32000)],
        ),
        "broadcast.ts": _media("mpegts", **H264_AAC),
        "dvd.mpg": _media(
            "mpeg", video=VideoSpec(codec="mpeg2video"), audio=[AudioSpec(codec="mp2")]
        ),
        "pair.mp4": _media("mp4", **H264_AAC),
        "pair.flac": _media("flac", audio=[AudioSpec(codec="flac", rate=16000)]),
        "pair.txt": b"a caption",
        "music.m4a": _media("ipod", audio=[AudioSpec(layout="5.1")]),
        "voice.opus": _media("opus", audio=[AudioSpec(codec="libopus")]),
        # FFmpeg's own Vorbis encoder (the wheel has no libvorbis) is stereo only.
        "ambience.oga": _media(
            "ogg",
            audio=[
                AudioSpec(codec="vorbis", rate=44100, layout="stereo", options={"strict": "-2"})
            ],
        ),
        # Album art is a video stream to FFmpeg ('attached picture'), not a video.
        "song.mp3": _media(
            "mp3", audio=[AudioSpec(codec="libmp3lame", rate=44100)], cover_art=True
        ),
        "raw.aac": _media("adts", audio=[AudioSpec(rate=8000)]),
        "take.aiff": _media(
            "aiff", audio=[AudioSpec(codec="pcm_s16be", rate=22050, layout="stereo")]
        ),
        "narrow.wav": _media("wav", audio=[AudioSpec(codec="pcm_s16le", rate=8000)]),
        "surround.flac": _media("flac", audio=[AudioSpec(codec="flac", layout="5.1")]),
        "extra.mka": _media("matroska", audio=[AudioSpec(codec="flac", rate=24000)]),
    }


def left_out_files() -> dict[str, tuple[bytes, str]]:
    """rel -> (bytes, the kind of reason it is reported with)."""
    mp4 = _media("mp4", **H264_AAC)
    webm = _media("webm", video=VideoSpec(codec="libvpx-vp9"), audio=[AudioSpec(codec="libopus")])
    flac = _media("flac", audio=[AudioSpec(codec="flac")])
    wav = _media("wav", audio=[AudioSpec(codec="pcm_s16le")])
    opus = _media("opus", audio=[AudioSpec(codec="libopus")])
    return {
        # Broken media: truncated, garbage under a media extension, empty.
        "broken/cut.webm": (truncated(webm), "truncated"),
        "broken/cut.wav": (truncated(wav), "truncated"),
        "broken/cut.mp4": (truncated(mp4), "unreadable"),  # its index is at the end
        "broken/cut.flac": (truncated(flac), "unreadable"),
        "broken/cut.opus": (truncated(opus), "unreadable"),
        "broken/noise.mp4": (garbage(seed=1), "unreadable"),
        "broken/noise.mkv": (garbage(seed=2), "unreadable"),
        "broken/noise.m4a": (garbage(seed=3), "unreadable"),
        "broken/noise.oga": (garbage(seed=4), "unreadable"),
        "broken/nothing.mov": (b"", "empty file"),
        "broken/nothing.opus": (b"", "empty file"),
        # Not media at all, or not packed.
        "docs/notes.pdf": (b"%PDF-1.4\n" + garbage(seed=5), "not media"),
        "docs/lyrics.srt": (b"1\n00:00:00,000 --> 00:00:01,000\nla la\n", "not media"),
        "h264_aac.png": (_png(), "still image"),  # beside a video: the video packs
        "README.txt": (b"what this folder holds", "sidecar without media"),
        "latents/a.npy": (b"\x93NUMPY", "array file"),
        ".DS_Store": (b"\x00\x00\x00\x01Bud1", "hidden file"),
        "LICENSE": (b"MIT", "no extension"),
        # Two videos of one name: the probe finds it.
        "dup.mp4": (mp4, "name conflict"),
        "dup.mkv": (_media("matroska", video=VideoSpec()), "name conflict"),
    }


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def entries(dst: Path) -> dict[str, SampleEntry]:
    out = {}
    for index in sorted((dst / "shards").glob("*.index.json")):
        for entry in parse_index(index.read_bytes(), str(index)).samples:
            out[entry.key] = entry
    return out


def members(dst: Path, entry: SampleEntry) -> dict[str, bytes]:
    """A sample's member bytes, read through the index."""
    for tar in sorted((dst / "shards").glob("*.tar")):
        index = parse_index(tar.with_name(tar.name.replace(".tar", ".index.json")).read_bytes(), "")
        if any(e.key == entry.key for e in index.samples):
            raw = tar.read_bytes()
            return {x: raw[m.offset : m.offset + m.size] for x, m in entry.members.items()}
    raise AssertionError(entry.key)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """The folder packed through the CLI: (SRC, DST, its --json summary)."""
    root = tmp_path_factory.mktemp("formats")
    src, dst = root / "src", root / "dst"
    write(src, good_files())
    write(src, {rel: data for rel, (data, _) in left_out_files().items()})
    result = stoker_text("data", "pack", str(src), str(dst), "--workers", "1", "--json")
    assert result.returncode == 0, result.stderr
    return src, dst, json.loads(result.stdout.strip().splitlines()[-1])


def test_every_file_left_out_is_reported_with_its_kind(
    packed: tuple[Path, Path, dict[str, Any]],
) -> None:
    src, dst, summary = packed
    expected = {str(src / rel): kind for rel, (_, kind) in left_out_files().items()}
    got = {row["path"]: row["kind"] for row in summary["skipped"]}
    assert got == expected
    counts: dict[str, int] = {}
    for kind in expected.values():
        counts[kind] = counts.get(kind, 0) + 1
    assert summary["skipped_by_kind"] == counts
    reasons = {Path(row["path"]).name: row["reason"] for row in summary["skipped"]}
    assert "share one name" in reasons["dup.mkv"] and "one video" in reasons["dup.mkv"]
    assert "truncated video" in reasons["cut.webm"]

    # The human summary (a re-run, which resumes: nothing left to write) counts them too.
    again = stoker_text("data", "pack", str(src), str(dst))
    assert again.returncode == 0, again.stderr
    total = sum(counts.values())
    assert f"skipped {total} inputs (" in again.stdout
    assert f"{counts['unreadable']} unreadable" in again.stdout
    assert "1 sidecar without media" in again.stdout
    assert f"  {src / 'LICENSE'}: no extension" in again.stdout


def test_each_format_gives_its_modalities_and_facts(
    packed: tuple[Path, Path, dict[str, Any]],
) -> None:
    _, dst, summary = packed
    facts = entries(dst)
    assert set(facts) == set(VIDEO) | set(AUDIO)
    assert summary["samples"] == len(facts)
    for key, entry in facts.items():
        if key in VIDEO:
            assert entry.video is not None, key
            width, height, rotation = VIDEO[key]
            assert (entry.video.width, entry.video.height, entry.video.rotation) == (
                width,
                height,
                rotation,
            ), key
            if key == "vfr":  # the last frame (at 0.9 s) lasts what the muxer guessed
                assert 0.9 < entry.video.duration_s < 1.3
            else:
                assert entry.video.duration_s == pytest.approx(SECONDS, abs=0.06), key
        else:
            assert entry.video is None, key
        if key in AUDIO:
            assert entry.audio is not None, key
            field, codec, rate, channels, stream = AUDIO[key]
            audio = entry.audio
            assert (audio.field, audio.codec, audio.sample_rate, audio.channels) == (
                field,
                codec,
                rate,
                channels,
            ), key
            assert audio.stream == stream, key
            # ADTS cannot say how much padding AAC added: up to ~0.2 s at 8 kHz.
            assert audio.duration_s == pytest.approx(SECONDS, abs=0.2 if key == "raw" else 0.05)
        else:
            assert entry.audio is None, key
    assert set(facts["pair"].members) == {"mp4", "flac", "txt"}
    assert set(facts["h264_aac"].members) == {"mp4"}  # the photo beside it is left out
    assert facts["vfr"].video is not None and facts["vfr"].video.frames == 6


def test_each_sample_decodes_upright_with_its_sound(
    packed: tuple[Path, Path, dict[str, Any]],
) -> None:
    _, dst, _ = packed
    for key, entry in entries(dst).items():
        data = members(dst, entry)
        if entry.video is not None:
            video = decode_video(
                data[entry.video.field],
                fps=8,
                size=None,
                start_s=0.25,
                clip_seconds=0.5,
                info=entry.video,
            )
            assert video.shape == (4, 3, entry.video.height, entry.video.width), key
            # The red block of the stored top-left corner, where the turn puts it.
            red = (video[0, 0] > 150) & (video[0, 1] < 100) & (video[0, 2] < 100)
            rows, cols = np.nonzero(red)
            corner = (rows.mean() < video.shape[2] / 2, cols.mean() < video.shape[3] / 2)
            turned = {0: (True, True), 90: (True, False), 180: (False, False)}
            assert corner == turned[entry.video.rotation], key
        if entry.audio is not None:
            audio = decode_audio(
                data[entry.audio.field],
                field=entry.audio.field,
                sample_rate=16000,
                channels=1,
                start_s=0.0,
                clip_seconds=0.4,  # before the click at 0.5 s: the tone alone
                info=entry.audio,
            )
            assert audio.shape == (1, 6400), key
            assert dominant_hz(audio, 16000) == pytest.approx(440, abs=5), key


def test_the_loader_reads_video_with_its_audio_track(
    packed: tuple[Path, Path, dict[str, Any]], tmp_path: Path
) -> None:
    from stoker.data.stream.loader import StreamingLoader

    src, _, _ = packed
    av_only = tmp_path / "av"
    for rel in ("webm_vp9.webm", "h264_aac.mp4", "phone/portrait.mp4", "broadcast.ts", "pair.mp4"):
        write(av_only, {rel: (src / rel).read_bytes()})
    dst = tmp_path / "dst"
    summary = json.loads(
        stoker_text("data", "pack", str(av_only), str(dst), "-w", "1", "--json", check=True)
        .stdout.strip()
        .splitlines()[-1]
    )
    assert summary["samples"] == 5 and summary["skipped"] == []
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["modalities"] == ["video", "audio"]
    loader = StreamingLoader(
        str(dst),
        batch_size=5,
        num_workers=0,
        modalities=("video", "audio"),
        fps=8,
        size=(32, 32),
        clip_seconds=0.5,
        sample_rate=8000,
        channels=2,
        clip_offset="start",
        shuffle=False,
    )
    (batch,) = list(loader.batches(max_batches=1))
    assert tuple(batch["video"].shape) == (5, 4, 3, 32, 32)
    assert tuple(batch["audio"].shape) == (5, 2, 4000)
    assert bool(batch["valid"].all()) and batch["skipped"] == []
    assert float(batch["audio"].abs().max()) > 0.05


def test_audio_stream_picks_a_track_and_a_resume_must_repeat_it(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    two = make_media("matroska", seconds=SECONDS, video=VideoSpec(),
                     audio=[AudioSpec(), AudioSpec(codec="libopus", freq=1000)])  # fmt: skip
    write(
        src,
        {
            "two.mkv": two,
            "one.mp4": _media("mp4", **H264_AAC),  # has no second track: reported
            "silent.mov": _media("mov", video=VideoSpec(codec="mjpeg", pix_fmt="yuvj420p")),
            "paired.mkv": two,  # its audio file wins over any track
            "paired.wav": _media("wav", audio=[AudioSpec(codec="pcm_s16le", rate=8000)]),
        },
    )
    result = stoker_text(
        "data", "pack", str(src), str(dst), "--audio-stream", "1", "-w", "1", "--json"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert [(Path(r["path"]).name, r["kind"]) for r in summary["skipped"]] == [
        ("one.mp4", "no such audio stream")
    ]
    assert "its audio track: holds 1 audio stream" in summary["skipped"][0]["reason"]
    facts = entries(dst)
    assert set(facts) == {"two", "silent", "paired"}
    two_audio = facts["two"].audio
    assert two_audio is not None
    assert (two_audio.field, two_audio.stream, two_audio.codec) == ("mkv", 1, "opus")
    assert facts["silent"].audio is None
    paired = facts["paired"].audio
    assert paired is not None and (paired.field, paired.stream) == ("wav", 0)
    pcm = decode_audio(
        members(dst, facts["two"])["mkv"], field="mkv", sample_rate=16000, channels=1,
        start_s=0.0, clip_seconds=0.4, info=two_audio,
    )  # fmt: skip
    assert dominant_hz(pcm, 16000) == pytest.approx(1000, abs=5)
    plan = json.loads((dst / "pack-plan.json").read_text())
    assert plan["options"]["audio_stream"] == 1

    other = stoker_text("data", "pack", str(src), str(dst))
    assert other.returncode == 2
    assert "--audio-stream 1 then, 0 now" in other.stderr and "--restart" in other.stderr


def test_the_tar_members_keep_their_extensions(
    packed: tuple[Path, Path, dict[str, Any]],
) -> None:
    """WebDataset's rule: key up to the first dot, the extension after it."""
    _, dst, _ = packed
    names = set()
    for tar in (dst / "shards").glob("*.tar"):
        with tarfile.open(tar) as archive:
            names |= set(archive.getnames())
    assert {"phone/portrait.mp4", "h264.m4v", "extra.mka", "pair.flac", "pair.txt"} <= names


def test_plain_webdataset_shards_give_a_videos_audio_track(tmp_path: Path) -> None:
    """The loader's in-memory index of plain tars follows the packer's rule: a video's
    audio track is the sample's audio, unless an audio member is there."""
    from stoker.data.sets.wds_index import index_tar

    mp4 = _media("mp4", **H264_AAC)
    flac = _media("flac", audio=[AudioSpec(codec="flac", rate=16000)])
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("a.mp4", mp4), ("b.mp4", mp4), ("b.flac", flac), ("c.flac", flac),
                           ("c.mp4", mp4)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    index = index_tar(buf, "plain.tar", "plain.tar")
    audio = {entry.key: entry.audio for entry in index.samples}
    assert all(a is not None for a in audio.values())
    assert {k: (a.field, a.sample_rate) for k, a in audio.items() if a is not None} == {
        "a": ("mp4", 48000),
        "b": ("flac", 16000),
        "c": ("flac", 16000),
    }
