"""`stoker data pack` on real media made here: grouping, broken inputs, clips, resume,
determinism across workers, memory://, and the SLURM array (through stoker's launcher)
on the local cluster."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import av
import numpy as np
import pytest
import soundfile as sf

from stoker.data.format.shard_format import parse_index, parse_manifest
from stoker.data.media.h264_flac import encode_flac, encode_h264
from stoker.data.media.probe import probe_audio, probe_video
from stoker.data.pack.plan import InputFile, assign_shards, group_samples
from stoker.errors import StokerError
from tests.clirun import stoker_text

if TYPE_CHECKING:
    from tests.cluster.localslurm import ClusterSettings

FPS = 10


def mp4(seconds: float, *, seed: int = 0, width: int = 64, height: int = 48) -> bytes:
    rng = np.random.default_rng(seed)
    frames = [
        rng.integers(0, 255, (height, width, 3), dtype=np.uint8) for _ in range(int(seconds * FPS))
    ]
    return encode_h264(frames, fps=FPS, width=width, height=height)


def flac(seconds: float, *, seed: int = 0, rate: int = 16000) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_flac(rng.uniform(-0.2, 0.2, int(seconds * rate)), sample_rate=rate)


def soundfile_bytes(seconds: float, fmt: str, subtype: str, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, np.stack([np.sin(440 * t), np.sin(330 * t)], 1) * 0.3, rate, format=fmt,
             subtype=subtype)  # fmt: skip
    return buf.getvalue()


def mkv(seconds: float, *, width: int, height: int) -> bytes:
    """H.264 in Matroska at an odd size (yuv444p allows it): clips must crop to even."""
    rng = np.random.default_rng(7)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="matroska") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv444p"
        for _ in range(int(seconds * FPS)):
            image = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def fails_mid_decode(seconds: float) -> bytes:
    """An mp4 that probes fine (demux + first packet) but whose 26th packet is garbage."""
    data = bytearray(mp4(seconds, seed=3))
    with av.open(io.BytesIO(bytes(data))) as container:
        packets = [(p.pos, p.size) for p in container.demux(video=0) if p.size]
    pos, size = packets[25]
    data[pos : pos + size] = b"\xff" * size
    probe_video(bytes(data), "mp4")  # the point: the probe cannot tell
    return bytes(data)


def write(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def pack(*args: Any, cwd: Path | None = None) -> dict[str, Any]:
    result = stoker_text("data", "pack", *map(str, args), "--json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def read_dataset(dst: Path) -> dict[str, dict[str, bytes]]:
    """key -> {ext: bytes}, checking manifest, indexes and tars against each other."""
    manifest = parse_manifest((dst / "manifest.json").read_bytes(), "manifest")
    samples: dict[str, dict[str, bytes]] = {}
    for record in manifest.shards:
        raw = (dst / record.path).read_bytes()
        assert len(raw) == record.bytes and hashlib.sha256(raw).hexdigest() == record.sha256
        index = parse_index((dst / record.index).read_bytes(), record.index)
        assert (index.bytes, index.sha256, len(index.samples)) == (
            record.bytes,
            record.sha256,
            record.samples,
        )
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            names = [m.name for m in tar.getmembers()]
        expected_names = []
        for entry in index.samples:
            members = {}
            for ext, member in entry.members.items():
                expected_names.append(f"{entry.key}.{ext}")
                members[ext] = raw[member.offset : member.offset + member.size]
            assert entry.key not in samples
            samples[entry.key] = members
        assert sorted(names) == sorted(expected_names)
    assert manifest.samples == len(samples)
    return samples


def entries(dst: Path) -> dict[str, Any]:
    out = {}
    for index in sorted((dst / "shards").glob("*.index.json")):
        for entry in parse_index(index.read_bytes(), str(index)).samples:
            out[entry.key] = entry
    return out


def test_pack_groups_copies_and_reports_broken_files(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    good = {
        "a.mp4": mp4(1, seed=1),
        "a.flac": flac(1, seed=1),
        "a.json": b'{"caption": "waves"}',
        "a.txt": "vagues \u00e9t\u00e9".encode(),
        "b.mp4": mp4(1, seed=2),
        "b.flac": flac(1, seed=2),
        "speech/c.mp4": mp4(1, seed=4),
        "speech/c.flac": flac(1, seed=4),
        "speech/c.json": b"[1, 2]",
        "speech/deep/d.take.2.ogg": soundfile_bytes(1, "OGG", "VORBIS"),
        "lone.wav": soundfile_bytes(1, "WAV", "PCM_16"),
        "films/odd.mkv": mkv(1, width=33, height=25),
    }
    broken = {
        "cut.mp4": mp4(2, seed=5)[:1500],  # truncated
        "cut.flac": flac(1),  # its healthy partner goes with it
        "speech/noise.flac": b"fLaC" + os.urandom(3000),
        "empty.mp4": b"",
    }
    # Not packed, and reported too: every file is either packed or named.
    left_out = {"README.txt": b"notes", "speech/c.png": b"\x89PNG", "orphan.json": b"{}"}
    write(src, {**good, **broken, **left_out})

    summary = pack(src, dst, "--workers", "1")

    assert summary["skipped"] == sorted(summary["skipped"], key=lambda s: s["path"])
    assert {s["path"] for s in summary["skipped"]} == {
        str(src / "cut.mp4"),
        str(src / "speech/noise.flac"),
        str(src / "empty.mp4"),
        *(str(src / rel) for rel in left_out),
    }
    reasons = {Path(s["path"]).name: s["reason"] for s in summary["skipped"]}
    assert reasons["empty.mp4"] == "empty file"
    kinds = {Path(s["path"]).name: s["kind"] for s in summary["skipped"]}
    assert kinds["README.txt"] == kinds["orphan.json"] == "sidecar without media"
    assert kinds["c.png"] == "not media"
    samples = read_dataset(dst)
    assert summary["samples"] == len(samples) == 6
    assert summary["shards"] == 1
    expected = {
        "a": {"mp4": "a.mp4", "flac": "a.flac", "json": "a.json", "txt": "a.txt"},
        "b": {"mp4": "b.mp4", "flac": "b.flac"},
        "speech/c": {"mp4": "speech/c.mp4", "flac": "speech/c.flac", "json": "speech/c.json"},
        "speech/deep/d_take_2": {"ogg": "speech/deep/d.take.2.ogg"},
        "lone": {"wav": "lone.wav"},
        "films/odd": {"mkv": "films/odd.mkv"},
    }
    assert set(samples) == set(expected)
    for key, members in expected.items():
        assert {ext: samples[key][ext] for ext in members} == {
            ext: good[rel] for ext, rel in members.items()
        }
        assert set(samples[key]) == set(members)
    facts = entries(dst)
    assert facts["a"].video.fps == FPS and facts["a"].audio.sample_rate == 16000
    assert facts["films/odd"].video.width == 33 and facts["films/odd"].audio is None
    assert facts["speech/deep/d_take_2"].audio.channels == 2
    manifest = json.loads((dst / "manifest.json").read_text())
    assert manifest["created_by"] == "stoker data pack"


def test_clip_seconds_cuts_short_gop_clips(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(
        src,
        {
            "talk.mp4": mp4(5),
            "talk.flac": flac(5, rate=22050),
            "talk.json": b'{"speaker": "ada"}',
            "talk.txt": b"hello",
            "odd.mkv": mkv(2.5, width=33, height=25),
            "short.wav": soundfile_bytes(1.5, "WAV", "PCM_16"),
            "glitch.mp4": fails_mid_decode(5),
            "glitch.flac": flac(5),
        },
    )
    summary = pack(src, dst, "--clip-seconds", "2", "--workers", "1")

    assert [s["path"] for s in summary["skipped"]] == [
        str(src / "glitch.mp4"),
        str(src / "short.wav"),
    ]
    assert "fails to decode" in summary["skipped"][0]["reason"]
    assert "shorter" in summary["skipped"][1]["reason"]
    samples = read_dataset(dst)
    assert sorted(samples) == ["odd_c0000", "talk_c0000", "talk_c0001"]
    for i in range(2):
        clip = samples[f"talk_c{i:04d}"]
        video = probe_video(clip["mp4"], "mp4")
        assert video.duration_s == pytest.approx(2.0) and video.frames == 2 * FPS
        assert video.keyframe_interval is not None and video.keyframe_interval <= video.fps
        audio = probe_audio(clip["flac"], "flac")
        assert (audio.duration_s, audio.sample_rate, audio.channels) == (2.0, 22050, 1)
        assert json.loads(clip["json"]) == {
            "speaker": "ada",
            "clip": {"index": i, "start_s": 2.0 * i, "end_s": 2.0 * (i + 1)},
        }
        assert clip["txt"] == b"hello"
    odd = probe_video(samples["odd_c0000"]["mp4"], "mp4")
    assert (odd.width, odd.height, odd.codec) == (32, 24, "h264")
    facts = entries(dst)
    assert facts["talk_c0001"].video.duration_s == pytest.approx(2.0)
    assert facts["talk_c0001"].audio.duration_s == 2.0


def test_clips_keep_a_fractional_frame_rate(tmp_path: Path) -> None:
    """NTSC's 30000/1001 stays 29.97: rounding to 30 would stretch time by 0.1%."""
    from fractions import Fraction

    ntsc = Fraction(30000, 1001)
    frames = [np.full((48, 64, 3), i, dtype=np.uint8) for i in range(90)]
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src, {"ntsc.mp4": encode_h264(frames, fps=ntsc, width=64, height=48)})
    summary = pack(src, dst, "--clip-seconds", "1", "--workers", "1")
    assert summary["samples"] == 3 and summary["skipped"] == []
    for key, clip in read_dataset(dst).items():
        video = probe_video(clip["mp4"], "mp4")
        assert video.fps == pytest.approx(float(ntsc), abs=1e-4), key
        assert video.frames == 30


def test_resume_rewrites_only_missing_shards(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src, {f"s{i}.flac": flac(0.5, seed=i) for i in range(8)})
    write(src, {"bad.flac": b"fLaC" + bytes(3000)})  # reported by shard 0, which is kept
    first = pack(src, dst, "--target-shard-mb", "0.02", "--workers", "1")
    assert [s["path"] for s in first["skipped"]] == [str(src / "bad.flac")]
    shards = dst / "shards"
    tars = sorted(shards.glob("*.tar"))
    assert first["shards"] == len(tars) >= 3
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino, p.read_bytes()) for p in
              shards.iterdir()}  # fmt: skip
    victim = tars[1]
    victim.unlink()
    victim.with_name(victim.name.replace(".tar", ".index.json")).unlink()

    again = pack(src, dst, "--target-shard-mb", "0.02", "--workers", "1")

    assert again == first
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_ino, p.read_bytes()) for p in
             shards.iterdir()}  # fmt: skip
    assert after.keys() == before.keys()
    for name, (mtime, inode, data) in after.items():
        assert data == before[name][2]
        rewritten = name.startswith(victim.name.removesuffix(".tar"))
        assert ((mtime, inode) != before[name][:2]) == rewritten, name
    manifest = json.loads((dst / "manifest.json").read_text())
    assert [s["path"] for s in manifest["shards"]] == [f"shards/{t.name}" for t in tars]

    other = stoker_text("data", "pack", str(src), str(dst), "--target-shard-mb", "1", "--json")
    assert other.returncode == 2 and other.stdout == ""
    assert "--target-shard-mb 0.02 then, 1 now" in other.stderr
    assert "--restart" in other.stderr
    assert (dst / "manifest.json").exists()  # a refused run changes nothing

    restarted = pack(src, dst, "--target-shard-mb", "1", "--restart", "--workers", "1")
    assert restarted["shards"] == 1 and restarted["samples"] == 8
    assert sorted(p.name for p in shards.glob("*.tar")) == ["shard-000000.tar"]


def test_changed_src_is_named_on_resume(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src, {"a.flac": flac(0.2), "b.flac": flac(0.2, seed=1)})
    pack(src, dst, "--workers", "1")
    write(src, {"c.flac": flac(0.2, seed=2)})
    result = stoker_text("data", "pack", str(src), str(dst))
    assert result.returncode == 2
    assert "1 added (e.g. c.flac)" in result.stderr and "--restart" in result.stderr


def test_two_workers_write_the_same_shards_as_one(tmp_path: Path) -> None:
    # Re-encoded video included: encode_h264 is deterministic (x264 with mbtree=0).
    src = tmp_path / "src"
    write(src, {f"v{i}.flac": flac(2, seed=i) for i in range(4)})
    write(src, {f"v{i}.mp4": mp4(2, seed=i) for i in range(4)})
    write(src, {f"w{i}.wav": soundfile_bytes(2, "WAV", "PCM_16") for i in range(2)})
    args = ("--clip-seconds", "1", "--target-shard-mb", "0.05")
    one = pack(src, tmp_path / "one", *args, "--workers", "1")
    two = pack(src, tmp_path / "two", *args, "--workers", "2")
    assert one == two and one["shards"] >= 3 and one["samples"] == 12
    assert pack(src, tmp_path / "two", *args, "--workers", "2") == two  # nothing left to write

    def digests(root: Path) -> dict[str, str]:
        return {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((root / "shards").iterdir())
        }

    assert digests(tmp_path / "one") == digests(tmp_path / "two")
    assert (tmp_path / "one/manifest.json").read_bytes() == (
        tmp_path / "two/manifest.json"
    ).read_bytes()


def test_memory_filesystem_packs_in_process() -> None:
    import fsspec
    from typer.testing import CliRunner

    from stoker.cli.app import app

    fs = fsspec.filesystem("memory")
    sources = {"clips/x.mp4": mp4(1), "clips/x.flac": flac(1), "bad.wav": b"RIFF\x00\x00"}
    for rel, data in sources.items():
        fs.pipe_file(f"/pack-src/{rel}", data)
    try:
        result = CliRunner().invoke(
            app, ["data", "pack", "memory://pack-src", "memory://pack-dst", "-w", "2", "--json"]
        )
        assert result.exit_code == 0, result.output
        summary = json.loads(result.stdout.strip().splitlines()[-1])
        assert summary["samples"] == 1 and summary["shards"] == 1
        assert [s["path"] for s in summary["skipped"]] == ["memory://pack-src/bad.wav"]
        manifest = parse_manifest(fs.cat_file("/pack-dst/manifest.json"), "manifest")
        raw = fs.cat_file(f"/pack-dst/{manifest.shards[0].path}")
        index = parse_index(fs.cat_file(f"/pack-dst/{manifest.shards[0].index}"), "index")
        (entry,) = index.samples
        assert entry.key == "clips/x"
        for ext in ("mp4", "flac"):
            member = entry.members[ext]
            assert raw[member.offset : member.offset + member.size] == sources[f"clips/x.{ext}"]
    finally:
        for root in ("/pack-src", "/pack-dst"):
            if fs.exists(root):
                fs.rm(root, recursive=True)


def test_missing_or_empty_src_is_a_clear_error(tmp_path: Path) -> None:
    missing = stoker_text("data", "pack", str(tmp_path / "nope"), str(tmp_path / "dst"))
    assert missing.returncode == 2
    assert (
        f"SRC '{tmp_path / 'nope'}' does not exist" in missing.stderr and "fix:" in missing.stderr
    )
    (tmp_path / "text").mkdir()
    (tmp_path / "text/a.txt").write_text("no media here")
    empty = stoker_text("data", "pack", str(tmp_path / "text"), str(tmp_path / "dst"))
    assert empty.returncode == 2 and "holds no media files" in empty.stderr
    assert not (tmp_path / "dst").exists()


def test_grouping_reports_conflicts_and_lone_sidecars() -> None:
    # Two videos of one name (x.mp4, x.mkv) are found by the writers' probe: a name
    # does not say what a file holds.
    names = [
        "x.mp4",
        "x.mkv",
        "x.json",
        "a.b.flac",
        "a_b.wav",
        "ok/one.MP4",
        "ok/one.txt",
        "ok/two.wav",
        "notes.txt",
        "meta.json",
    ]
    samples, skipped = group_samples({n: InputFile(size=10) for n in names})
    assert [(s.key, sorted(s.members)) for s in samples] == [
        ("ok/one", ["mp4", "txt"]),
        ("ok/two", ["wav"]),
        ("x", ["json", "mkv", "mp4"]),
    ]
    assert samples[0].members["mp4"].path == "ok/one.MP4"
    assert [(s.path, s.kind) for s in skipped] == [
        ("a.b.flac", "name conflict"),
        ("a_b.wav", "name conflict"),
        ("meta.json", "sidecar without media"),
        ("notes.txt", "sidecar without media"),
    ]
    assert "'a_b'" in skipped[0].reason


def test_shards_fill_greedily_in_key_order() -> None:
    samples, _ = group_samples({f"k{i}.wav": InputFile(size=1000 * (i + 1)) for i in range(5)})
    shards = assign_shards(samples, target_bytes=4000)
    # Sizes with tar overhead: 2024, 3024, 4024, 5024, 6024: each too big to share.
    assert [[s.key for s in shard] for shard in shards] == [["k0"], ["k1"], ["k2"], ["k3"], ["k4"]]
    shards = assign_shards(list(reversed(samples)), target_bytes=6000)
    assert [[s.key for s in shard] for shard in shards] == [["k0", "k1"], ["k2"], ["k3"], ["k4"]]


def test_failed_shards_fail_the_pack_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src, {"a.flac": flac(0.2), "b.flac": flac(0.2, seed=1)})
    dst.mkdir()
    (dst / "pack-skipped").write_text("in the way")  # the writers' report folder
    failed = stoker_text("data", "pack", str(src), str(dst), "--workers", "1", "--json")
    assert failed.returncode == 2 and failed.stdout == ""
    assert "1 shard of 1 was not written" in failed.stderr
    assert "shards/shard-000000.tar: FileExistsError" in failed.stderr
    assert "run the same command again" in failed.stderr
    assert not (dst / "manifest.json").exists()
    (dst / "pack-skipped").unlink()
    assert pack(src, dst, "--workers", "1")["samples"] == 2


def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    from tests.clirun import stoker_in_tty

    write(tmp_path / "src", {"a.flac": flac(0.2)})
    screen = stoker_in_tty("data", "pack", str(tmp_path / "src"), str(tmp_path / "dst"))
    assert "writing shards" in screen and "1/1" in screen
    assert "1 sample in 1 shard:" in screen  # not "1 samples in 1 shards"


@pytest.mark.slurm
def test_slurm_array_packs_like_local(slurm_cluster: ClusterSettings, tmp_path: Path) -> None:
    from tests.launcher_jobs import wait_final

    src = tmp_path / "src"
    write(src, {f"s{i}.mp4": mp4(1, seed=i) for i in range(3)})
    write(src, {f"s{i}.flac": flac(1, seed=i) for i in range(3)})
    write(src, {"bad.mp4": mp4(1)[:900]})
    # SRC and DST relative to the submitting folder: the array tasks run elsewhere.
    args = ("--target-shard-mb", "0.03")
    local = pack("src", "local", *args, "--workers", "1", cwd=tmp_path)
    assert local["shards"] >= 2
    assert [s["path"] for s in local["skipped"]] == ["src/bad.mp4"]

    dst = tmp_path / "slurm"
    dst.mkdir()
    (dst / "pack-skipped").write_text("in the way")  # every array task fails
    # As docs/data.md writes it: `--slurm --time 2:00:00 -p cpu` (its clips are 4 s and
    # longer; these are 1 s, so no --clip-seconds 4: it would keep none).
    slurm_args = (*args, "--slurm", "--time", "2:00:00", "-p", slurm_cluster.partition)
    submitted = stoker_text("data", "pack", "src", "slurm", *slurm_args, "--json", cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout.strip().splitlines()[-1])["job_id"]
    plan = json.loads((dst / "pack-plan.json").read_text())
    task_ids = [f"{job}_{i}" for i in range(len(plan["shards"]))]  # one task per shard
    status = stoker_text("status", job, "--json", check=True)
    assert sorted(row["job_id"] for row in json.loads(status.stdout)) == sorted(task_ids)
    for task in task_ids:
        wait_final(task, timeout=180)
    rows = json.loads(stoker_text("status", job, "--json", check=True).stdout)
    assert {row["state"] for row in rows} == {"FAILED"}
    table = stoker_text("status", job, check=True).stdout  # the docs' plain `stoker status`
    assert all(task in table for task in task_ids), table
    why = stoker_text("why", task_ids[0], check=True)
    assert "FileExistsError" in why.stdout and "slurm/pack-skipped" in why.stdout, why.stdout
    log = stoker_text("logs", task_ids[0], check=True).stdout
    assert "stoker: error: task 0: 1 shard of 1 was not written" in log, log
    assert not (dst / "manifest.json").exists()

    (dst / "pack-skipped").unlink()
    assert pack("src", "slurm", *slurm_args, "--wait", cwd=tmp_path) == local
    names = ["manifest.json", *(f"shards/{p.name}" for p in (tmp_path / "local/shards").iterdir())]
    for name in names:
        assert (dst / name).read_bytes() == (tmp_path / "local" / name).read_bytes(), name


def test_slurm_flags_need_slurm_and_memory_needs_this_process(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from stoker.cli.app import app

    write(tmp_path / "src", {"a.flac": flac(0.2)})
    alone = stoker_text("data", "pack", str(tmp_path / "src"), str(tmp_path / "dst"), "--time", "5")
    assert alone.returncode == 2 and "--time applies to a SLURM pack only" in alone.stderr
    both = stoker_text("data", "pack", str(tmp_path / "src"), str(tmp_path / "dst"), "--tasks", "2",
                  "--wait")  # fmt: skip
    assert both.returncode == 2 and "--tasks, --wait apply to a SLURM pack only" in both.stderr
    assert not (tmp_path / "dst").exists()
    result = CliRunner().invoke(
        app, ["data", "pack", str(tmp_path / "src"), "memory://slurm-dst", "--slurm"]
    )
    assert "--slurm cannot pack memory://" in str(result.exception)


def test_pack_task_writes_its_share_and_the_last_one_the_manifest(tmp_path: Path) -> None:
    """An array task of `data pack --slurm`, here: what the work file gives it, a stop
    request, the manifest only from the task that completes the set."""
    import subprocess
    import sys

    from stoker.data.jobs import pack_task
    from stoker.data.pack.pipeline import PackRequest, plan_digest, prepare_pack
    from stoker.data.pack.plan import PackOptions
    from stoker.protocol import EXIT_REQUEUE

    src, dst = tmp_path / "src", tmp_path / "dst"
    write(src, {f"s{i}.flac": flac(0.5, seed=i) for i in range(4)})
    local = tmp_path / "local"
    pack(src, local, "--target-shard-mb", "0.02", "--workers", "1")
    options = PackOptions(target_shard_mb=0.02)
    prepared = prepare_pack(PackRequest(str(src), str(dst), options))
    planned = len(prepared.plan.shards)
    assert prepared.pending == list(range(planned)) and planned >= 3
    work = tmp_path / "work.json"
    groups = [[0], list(range(1, planned))]
    work.write_text(json.dumps({"groups": groups, "src_url": prepared.src_url,
                                "plan_sha256": plan_digest(prepared.plan)}))  # fmt: skip

    assert pack_task.run_task(str(dst), str(work), 1, lambda: True) == EXIT_REQUEUE
    assert not list(dst.glob("shards/*.tar"))
    assert pack_task.run_task(str(dst), str(work), 1, lambda: False) == 0
    assert len(list(dst.glob("shards/*.tar"))) == planned - 1
    assert not (dst / "manifest.json").exists()  # shard 0 is not there yet
    assert pack_task.run_task(str(dst), str(work), 0, lambda: False) == 0
    assert (dst / "manifest.json").read_bytes() == (local / "manifest.json").read_bytes()

    beyond = subprocess.run(
        [sys.executable, "-m", "stoker.data.jobs.pack_task", str(dst), "--work", str(work),
         "--task", "2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert beyond.returncode == 1
    assert f"stoker: error: task 2 is not one of the 2 in {work}" in beyond.stderr
    prepare_pack(PackRequest(str(src), str(dst), PackOptions(target_shard_mb=1), restart=True))
    with pytest.raises(StokerError, match="was planned again since this job was submitted"):
        pack_task.run_task(str(dst), str(work), 0, lambda: False)
