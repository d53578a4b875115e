"""`stoker data synth`: real H.264 and FLAC, an index that points at the right bytes,
sound that follows the picture, byte-equal reruns. No mocks: every check decodes
what was written."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import av
import fsspec
import numpy as np
import pytest
import soundfile as sf

from stoker.data.format.shard_format import Manifest, parse_index, parse_manifest
from stoker.data.synthetic.shapes import FREQ_RANGE_HZ, PALETTE, synth_dataset
from stoker.errors import StokerError
from tests.clirun import stoker_in_tty, stoker_text

# Small but not trivial: two shards (4 + 2), a non-square frame (a height/width mix-up
# shows), 2 s clips so shapes bounce. ~0.3 s to write on one core.
CLIPS, SECONDS, HEIGHT, WIDTH, FPS, RATE, PER_SHARD = 6, 2.0, 48, 64, 8, 16000, 4
FRAMES = round(SECONDS * FPS)


class Written:
    def __init__(self, root: Path, manifest: Manifest, progress: list[int]) -> None:
        self.root = root
        self.manifest = manifest
        self.progress = progress
        self.indexes = [
            parse_index((root / s.index).read_bytes(), s.index) for s in manifest.shards
        ]

    def members(self) -> dict[str, bytes]:
        return read_members(self.root, self.manifest)


def read_members(root: Path, manifest: Manifest) -> dict[str, bytes]:
    """Every member of every shard, as tarfile reads it: {"clip-000000.mp4": ...}."""
    found: dict[str, bytes] = {}
    for shard in manifest.shards:
        with tarfile.open(root / shard.path) as tar:
            for info in tar.getmembers():
                handle = tar.extractfile(info)
                assert handle is not None
                found[info.name] = handle.read()
    return found


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Written:
    root = tmp_path_factory.mktemp("synth") / "ds"
    progress: list[int] = []
    manifest = synth_dataset(
        str(root),
        clips=CLIPS,
        seconds=SECONDS,
        size=(HEIGHT, WIDTH),
        fps=FPS,
        sample_rate=RATE,
        samples_per_shard=PER_SHARD,
        progress=progress.append,
    )
    return Written(root, manifest, progress)


def test_manifest_agrees_with_indexes_and_files(written: Written) -> None:
    manifest = parse_manifest((written.root / "manifest.json").read_bytes(), "manifest")
    assert manifest == written.manifest
    assert manifest.created_by == "stoker data synth"
    assert [s.path for s in manifest.shards] == [
        "shards/shard-000000.tar",
        "shards/shard-000001.tar",
    ]
    assert [s.samples for s in manifest.shards] == [4, 2]
    assert manifest.samples == CLIPS == sum(len(i.samples) for i in written.indexes)
    assert manifest.fields == ["flac", "json", "mp4", "txt"]
    keys = [e.key for index in written.indexes for e in index.samples]
    assert keys == [f"clip-{i:06d}" for i in range(CLIPS)]
    for record, index in zip(manifest.shards, written.indexes, strict=True):
        raw = (written.root / record.path).read_bytes()
        assert record.bytes == index.bytes == len(raw)
        assert record.sha256 == index.sha256 == hashlib.sha256(raw).hexdigest()
    assert manifest.totals.bytes == sum(
        (written.root / s.path).stat().st_size for s in manifest.shards
    )
    assert manifest.totals.video_frames == CLIPS * FRAMES
    assert manifest.totals.duration_s == pytest.approx(CLIPS * SECONDS)
    assert manifest.totals.audio_seconds == pytest.approx(CLIPS * SECONDS)
    assert written.progress == list(range(1, CLIPS + 1))


def test_index_offsets_point_at_the_member_bytes(written: Written) -> None:
    members = written.members()
    indexed = set()
    for record, index in zip(written.manifest.shards, written.indexes, strict=True):
        raw = (written.root / record.path).read_bytes()
        for entry in index.samples:
            assert set(entry.members) == {"mp4", "flac", "json", "txt"}
            for ext, member in entry.members.items():
                name = f"{entry.key}.{ext}"
                indexed.add(name)
                assert raw[member.offset : member.offset + member.size] == members[name]
    assert indexed == set(members)  # no member the index does not know


def test_media_decode_to_what_was_asked(written: Written) -> None:
    members = written.members()
    for entry in (e for index in written.indexes for e in index.samples):
        with av.open(io.BytesIO(members[f"{entry.key}.mp4"])) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264"
            assert stream.average_rate == FPS
            keyframes = [p.is_keyframe for p in container.demux(stream) if p.size]
        with av.open(io.BytesIO(members[f"{entry.key}.mp4"])) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == len(keyframes) == FRAMES
        assert {f.shape for f in frames} == {(HEIGHT, WIDTH, 3)}
        positions = [i for i, key in enumerate(keyframes) if key]
        gaps = np.diff([*positions, FRAMES])
        assert positions[0] == 0 and gaps.max() <= FPS
        info = sf.info(io.BytesIO(members[f"{entry.key}.flac"]))
        assert (info.format, info.samplerate, info.channels) == ("FLAC", RATE, 2)
        assert info.frames == round(SECONDS * RATE)
        # The index states what a reader finds.
        assert entry.video is not None and entry.audio is not None
        assert (entry.video.width, entry.video.height) == (WIDTH, HEIGHT)
        assert (entry.video.frames, entry.video.fps) == (FRAMES, FPS)
        assert entry.video.keyframe_interval is not None and entry.video.keyframe_interval <= FPS
        assert (entry.audio.sample_rate, entry.audio.frames) == (RATE, info.frames)


def _decode(written: Written, key: str) -> tuple[list[np.ndarray[Any, Any]], np.ndarray[Any, Any]]:
    members = written.members()
    with av.open(io.BytesIO(members[f"{key}.mp4"])) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    audio, _ = sf.read(io.BytesIO(members[f"{key}.flac"]))
    return frames, audio


def _ranks(values: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.argsort(np.argsort(values)).astype(np.float64)


def test_sound_follows_the_picture(written: Written) -> None:
    """Per frame: shape height vs the tone's dominant frequency in that frame's audio
    window, and horizontal position vs the right channel's share of the energy."""
    window = RATE // FPS  # 2000 samples: 8 Hz FFT bins
    heights, freqs, xs, pans = [], [], [], []
    for clip in range(CLIPS):
        frames, audio = _decode(written, f"clip-{clip:06d}")
        for k, frame in enumerate(frames):
            ys, xs_k = np.nonzero(frame.max(axis=2) > 100)  # shape bright, background < 40
            chunk = audio[k * window : (k + 1) * window]
            spectrum = np.abs(np.fft.rfft(chunk.sum(axis=1) * np.hanning(window)))
            heights.append(HEIGHT - ys.mean())
            xs.append(xs_k.mean())
            freqs.append(np.fft.rfftfreq(window, 1 / RATE)[spectrum.argmax()])
            energy = (chunk**2).sum(axis=0)
            pans.append(energy[1] / energy.sum())
    h, f = np.array(heights), np.array(freqs)
    assert FREQ_RANGE_HZ[0] - 10 <= f.min() and f.max() <= FREQ_RANGE_HZ[1] + 10
    assert f.max() / f.min() > 3  # the pitch moves: not one tone for all
    # Measured: Pearson 0.99, Spearman 0.99 (frame k shows t = k/fps, its window
    # spans the next 1/fps: a small, constant lag).
    assert np.corrcoef(h, np.log(f))[0, 1] > 0.9
    assert np.corrcoef(_ranks(h), _ranks(f))[0, 1] > 0.9
    assert np.corrcoef(np.array(xs), np.array(pans))[0, 1] > 0.9


def test_metadata_and_caption_describe_the_clip(written: Written) -> None:
    members = written.members()
    shapes = set()
    for clip in range(CLIPS):
        key = f"clip-{clip:06d}"
        meta = json.loads(members[f"{key}.json"])
        caption = members[f"{key}.txt"].decode()
        assert (meta["clip"], meta["seed"]) == (clip, 0)
        assert meta["shape"] in ("square", "circle") and meta["colour"] in PALETTE
        assert caption.startswith(f"a {meta['colour']} {meta['shape']} moving ")
        up = meta["velocity_px_s"]["y"] < 0
        assert ("moving up" in caption and "tone rises" in caption) == up
        assert ("moving down" in caption and "tone falls" in caption) == (not up)
        frames, _ = _decode(written, key)
        ys, xs = np.nonzero(frames[0].max(axis=2) > 100)
        # The first frame shows the shape where the metadata says it starts.
        assert abs(xs.mean() - meta["start_px"]["x"]) < 1.0
        assert abs(ys.mean() - meta["start_px"]["y"]) < 1.0
        shapes.add(meta["shape"])
    assert shapes == {"square", "circle"}  # seed 0 draws both in six clips


def _shas(manifest: Manifest) -> list[str]:
    return [s.sha256 for s in manifest.shards]


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    args: dict[str, Any] = {"clips": 3, "seconds": 1.0, "samples_per_shard": 2}
    first = synth_dataset(str(tmp_path / "a"), **args)
    # Clips depend only on (seed, index): spawned encoder processes give the same bytes.
    again = synth_dataset(str(tmp_path / "b"), workers=2, **args)
    other = synth_dataset(str(tmp_path / "c"), seed=1, **args)
    assert len(first.shards) == 2
    assert _shas(again) == _shas(first)
    manifest_a, manifest_b = (tmp_path / d / "manifest.json" for d in "ab")
    assert manifest_a.read_bytes() == manifest_b.read_bytes()
    # Another seed draws other clips, not only another "seed" in the metadata.
    ours, theirs = read_members(tmp_path / "a", first), read_members(tmp_path / "c", other)
    for name in ours:
        if name.endswith((".mp4", ".flac")):
            assert ours[name] != theirs[name], name


def test_memory_destination() -> None:
    fs = fsspec.filesystem("memory")
    try:
        manifest = synth_dataset("memory://synth-test/ds", clips=2, seconds=1.0)
        raw = fs.cat_file("/synth-test/ds/" + manifest.shards[0].path)
        assert hashlib.sha256(raw).hexdigest() == manifest.shards[0].sha256
        stored = parse_manifest(fs.cat_file("/synth-test/ds/manifest.json"), "memory")
        assert stored == manifest and stored.samples == 2
    finally:
        if fs.exists("/synth-test"):
            fs.rm("/synth-test", recursive=True)


def test_existing_data_set_needs_overwrite(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    synth_dataset(str(root), clips=3, seconds=1.0, samples_per_shard=1)
    before = (root / "manifest.json").read_bytes()
    with pytest.raises(StokerError) as caught:
        synth_dataset(str(root), clips=2, seconds=1.0, seed=5)
    assert str(root) in caught.value.message and "--overwrite" in str(caught.value.fix)
    assert (root / "manifest.json").read_bytes() == before

    manifest = synth_dataset(str(root), clips=2, seconds=1.0, seed=5, overwrite=True)
    assert (root / "manifest.json").read_bytes() != before
    assert parse_manifest((root / "manifest.json").read_bytes(), "m") == manifest
    assert manifest.samples == 2 and len(manifest.shards) == 1
    # The old set's shards the new manifest does not list are gone.
    left = sorted(p.name for p in (root / "shards").iterdir())
    assert left == ["shard-000000.index.json", "shard-000000.tar"]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"size": (63, 64)}, "63x64"),
        ({"size": (64, 30 + 1)}, "64x31"),
        ({"size": (8, 8)}, "8x8"),
        ({"fps": 0}, "fps 0"),
        ({"sample_rate": 4000}, "4000"),
        ({"seconds": 0.01}, "0.01"),
        ({"clips": 0}, "clips 0"),
    ],
)
def test_bad_arguments_name_the_value(tmp_path: Path, kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(StokerError) as caught:
        synth_dataset(str(tmp_path / "ds"), **kwargs)
    assert named in caught.value.message and caught.value.fix
    assert not (tmp_path / "ds").exists()


def test_cli_json_summary_then_human_summary(tmp_path: Path) -> None:
    dst = str(tmp_path / "ds")
    result = stoker_text(
        "data", "synth", dst, "--clips", "4", "--seconds", "1", "--json", check=True
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    manifest = parse_manifest((tmp_path / "ds/manifest.json").read_bytes(), "m")
    assert summary == {
        "url": dst,
        "samples": 4,
        "shards": 1,
        "bytes": manifest.totals.bytes,
        "duration_s": 4.0,
    }
    # Off a terminal: plain lines, not one per clip (a few clips take less than 10 s).
    assert result.stderr.count("synth: ") == 1 and "synth: 4/4 clips" in result.stderr

    again = stoker_text("data", "synth", dst, "--clips", "2", "--seconds", "1", "--seed", "3")
    assert again.returncode == 2 and "--overwrite" in again.stderr

    human = stoker_text(
        "data", "synth", dst, "--clips", "2", "--seconds", "1", "--overwrite", check=True
    )
    assert human.stdout.startswith("wrote 2 clips (2 s of media,")
    assert dst in human.stdout


@pytest.mark.parametrize("size", ["63x64", "abc", "64x"])
def test_cli_bad_size_exits_2_naming_it(tmp_path: Path, size: str) -> None:
    result = stoker_text("data", "synth", str(tmp_path / "ds"), "--size", size)
    assert result.returncode == 2
    assert size in result.stderr and "fix:" in result.stderr
    assert not (tmp_path / "ds").exists()


def test_cli_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    screen = stoker_in_tty("data", "synth", str(tmp_path / "ds"), "--clips", "3", "--seconds", "1")
    assert "synth clips" in screen and "3/3" in screen
    assert "wrote 3 clips" in screen


def test_s3_destination_and_overwrite(s3_env: Any) -> None:
    """A real S3 API (moto server): shards and manifest go up as objects; an
    overwrite removes the objects of shards the new manifest does not list."""
    import s3fs

    bucket = s3_env.new_bucket()
    url = f"s3://{bucket}/toy"
    first = synth_dataset(url, clips=2, seconds=1.0, samples_per_shard=1)
    fs = s3fs.S3FileSystem()
    for record in first.shards:
        raw = fs.cat_file(f"{bucket}/toy/{record.path}")
        assert hashlib.sha256(raw).hexdigest() == record.sha256
    assert parse_manifest(fs.cat_file(f"{bucket}/toy/manifest.json"), url) == first

    with pytest.raises(StokerError):
        synth_dataset(url, clips=1, seconds=1.0)
    second = synth_dataset(url, clips=1, seconds=1.0, overwrite=True)
    fs.invalidate_cache()
    assert sorted(fs.ls(f"{bucket}/toy/shards")) == [
        f"{bucket}/toy/shards/shard-000000.index.json",
        f"{bucket}/toy/shards/shard-000000.tar",
    ]
    assert parse_manifest(fs.cat_file(f"{bucket}/toy/manifest.json"), url) == second


def test_files_layout_writes_loose_media_that_pack_reads(tmp_path: Path) -> None:
    """`--files`: the clips as raw media files, exactly the members the shards would hold."""
    raw = tmp_path / "raw"
    result = stoker_text(
        "data", "synth", str(raw), "--clips", "3", "--seconds", "1", "--files", "--json"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    names = sorted(p.name for p in raw.iterdir())
    assert names == sorted(
        f"clip-{i:06d}.{e}" for i in range(3) for e in ("mp4", "flac", "json", "txt")
    )
    assert summary["files"] == 12 and summary["bytes"] == sum(
        p.stat().st_size for p in raw.iterdir()
    )
    shards = tmp_path / "shards"
    synth_dataset(str(shards), clips=3, seconds=1)
    with tarfile.open(shards / "shards" / "shard-000000.tar") as tar:
        for name in names:
            member = tar.extractfile(name)
            assert member is not None and member.read() == (raw / name).read_bytes(), name
