"""`stoker data inspect` and `stoker data bench` as a user runs them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import av
import pytest

from stoker.data.synthetic.shapes import synth_dataset
from tests.clirun import stoker_text


@pytest.fixture(scope="module")
def small_set(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("cli") / "set"
    synth_dataset(str(root), clips=12, seconds=2.0, size=(48, 64), fps=8, samples_per_shard=5)
    return str(root)


def test_inspect_reports_the_manifest_and_writes_frames(small_set: str, tmp_path: Path) -> None:
    result = stoker_text(
        "data",
        "inspect",
        small_set,
        "--json",
        "--frames",
        "2",
        "--frames-dir",
        str(tmp_path),
        check=True,
    )
    report = json.loads(result.stdout)
    assert report["samples"] == 12 and report["shards"] == 3
    assert report["shard_samples"] == {"min": 2.0, "median": 5.0, "max": 5.0, "mean": 4.0}
    assert report["modalities"] == ["video", "audio", "text", "meta"]
    assert report["video"]["sizes"] == {"48x64": 12} and report["video"]["frames"] == 12 * 16
    assert report["audio"]["sample_rates"] == {"16000": 12}
    assert report["sample_duration_s"]["median"] == pytest.approx(2.0)
    assert len(report["frames_written"]) == 2
    for path in report["frames_written"]:
        with av.open(io.BytesIO(Path(path).read_bytes())) as png:
            frame = next(png.decode(video=0))
            assert (frame.height, frame.width) == (48, 64)
            assert frame.to_ndarray(format="rgb24").std() > 5  # a picture, not a blank


def test_inspect_leaves_the_current_folder_alone_and_says_where_frames_went(
    small_set: str, tmp_path: Path
) -> None:
    """A new user's `stoker data inspect URL` in their project folder: the frames go to
    a fresh temporary folder, named in the output, never into the current folder."""
    import re
    import shutil

    here = tmp_path / "project"
    here.mkdir()
    result = stoker_text("data", "inspect", small_set, cwd=here, check=True)
    assert list(here.iterdir()) == []
    said = re.search(r"wrote 3 frames to (\S+) ", result.stderr)
    assert said, result.stderr
    folder = Path(said.group(1))
    try:
        assert folder.is_dir() and not folder.is_relative_to(here)
        assert len(list(folder.glob("*.png"))) == 3
        assert str(folder) in result.stdout  # the table's "frames written" rows
    finally:
        shutil.rmtree(folder)


def test_inspect_human_output_and_missing_data_set(small_set: str, tmp_path: Path) -> None:
    text = stoker_text("data", "inspect", small_set, "--frames", "0", check=True).stdout
    assert "12 in 3 shards" in text and "h264 (12)" in text
    # Every number with its unit: no bare "8.0:12" or "16000:12".
    assert "16000 Hz (12)" in text and " fps (12)" in text and " ch (12)" in text
    missing = stoker_text("data", "inspect", str(tmp_path / "none"))
    assert missing.returncode == 2
    assert "manifest.json is missing" in missing.stderr and "stoker data pack" in missing.stderr


def test_bench_times_the_loader_and_computes_headroom(small_set: str) -> None:
    result = stoker_text(
        "data",
        "bench",
        small_set,
        "--workers",
        "1",
        "--batch-size",
        "4",
        "--batches",
        "4",
        "--step-rate",
        "0.5",
        "--size",
        "32x32",
        "--json",
        check=True,
    )
    figures = json.loads(result.stdout)
    assert figures["batches"] == 4 and figures["skipped_samples"] == 0
    assert figures["samples_per_s"] > 0 and figures["frames_per_s"] > 0
    assert figures["bytes_per_s"] > 0
    assert figures["headroom"] == pytest.approx(figures["steps_per_s"] / 0.5, rel=0.02)
    human = stoker_text("data", "bench", small_set, "--workers", "0", "--batches", "2", check=True)
    assert "samples/s" in human.stdout and "headroom" in human.stdout
