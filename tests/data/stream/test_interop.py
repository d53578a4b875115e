"""WebDataset interop, both ways, on real encoded media: the `webdataset` library
reads our shards member for member, and our loader reads shards that
`webdataset.ShardWriter` wrote (no index, no manifest) by brace pattern or folder."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import webdataset as wds

from stoker.data.format.shard_format import MANIFEST_NAME, ShardIndex, parse_index, parse_manifest
from stoker.data.media.decode import decode_audio, decode_video
from stoker.data.stream.loader import StreamingLoader

CLIPS = 10
PER_SHARD = 4  # 4, 4, 2: a short last shard
BATCH = 5
AV: dict[str, Any] = {"fps": 8, "size": (32, 32), "clip_seconds": 1.0, "sample_rate": 8000}
MEDIA = ("mp4", "flac", "json")


@pytest.fixture(scope="module")
def dataset(synthetic_av_set: Callable[..., Path]) -> Path:
    return synthetic_av_set(
        clips=CLIPS, size=(32, 32), sample_rate=8000, samples_per_shard=PER_SHARD
    )


def shards_of(root: Path) -> list[tuple[Path, ShardIndex]]:
    manifest = parse_manifest((root / MANIFEST_NAME).read_bytes(), str(root))
    return [
        (root / s.path, parse_index((root / s.index).read_bytes(), s.index))
        for s in manifest.shards
    ]


def member_bytes(root: Path) -> dict[str, dict[str, bytes]]:
    """Every sample's members, by key, cut from the tars where our index says they lie."""
    out = {}
    for tar_path, index in shards_of(root):
        tar = tar_path.read_bytes()
        for e in index.samples:
            out[e.key] = {ext: tar[m.offset : m.offset + m.size] for ext, m in e.members.items()}
    return out


def decode_direct(members: dict[str, bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    """What the loader must give for a clip from the start, decoded without it."""
    video = decode_video(
        members["mp4"], fps=AV["fps"], size=AV["size"], start_s=0.0, clip_seconds=1.0
    )
    audio = decode_audio(
        members["flac"],
        field="flac",
        sample_rate=AV["sample_rate"],
        channels=1,
        start_s=0.0,
        clip_seconds=1.0,
    )
    return torch.from_numpy(video), torch.from_numpy(audio)


def test_webdataset_iterates_our_shards_member_for_member(dataset: Path) -> None:
    shards = shards_of(dataset)
    assert len(shards) == 3
    urls = [str(path) for path, _ in shards]
    got = list(wds.WebDataset(urls, shardshuffle=False, empty_check=True))

    expected = [e.key for _, index in shards for e in index.samples]
    assert [s["__key__"] for s in got] == expected and len(expected) == CLIPS
    by_key = member_bytes(dataset)
    for sample in got:
        members = by_key[sample["__key__"]]
        assert set(members) == {"mp4", "flac", "json", "txt"}
        assert {k for k in sample if not k.startswith("__")} == set(members)
        for ext, data in members.items():
            assert sample[ext] == data, f"{sample['__key__']}.{ext}: offsets point elsewhere"
        meta = json.loads(sample["json"])
        assert f"clip-{meta['clip']:06d}" == sample["__key__"]
        video = decode_video(sample["mp4"], fps=8, size=None, start_s=0.5, clip_seconds=1.0)
        assert video.shape == (8, 3, 32, 32) and video.std() > 1  # frames, not zeros
        audio = decode_audio(
            sample["flac"], field="flac", sample_rate=8000, channels=2, start_s=0.5, clip_seconds=1
        )
        assert audio.shape == (2, 8000) and np.abs(audio).max() > 0.01


def write_with_webdataset(folder: Path, samples: list[dict[str, Any]]) -> None:
    folder.mkdir()
    with wds.ShardWriter(str(folder / "shard-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for sample in samples:
            sink.write(sample)
    # Three shards and nothing else: no index, no manifest.
    assert sorted(p.name for p in folder.iterdir()) == [f"shard-{i:06d}.tar" for i in range(3)]


def wds_samples(dataset: Path) -> list[dict[str, Any]]:
    """Our clips as WebDataset samples under other keys, some with a folder in the key
    (WebDataset's key is the member name up to the first dot of its base name)."""
    by_key = member_bytes(dataset)
    return [
        {"__key__": f"part{i % 2}/sample{i:04d}", **{ext: members[ext] for ext in MEDIA}}
        for i, members in enumerate(by_key.values())
    ]


@pytest.fixture(scope="module")
def wds_folder(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("wds") / "shards"
    write_with_webdataset(folder, wds_samples(dataset))
    return folder


def check_epochs(batches: list[dict[str, Any]], samples: list[dict[str, Any]]) -> None:
    """Every sample exactly once per epoch, each decoded as a direct decode does."""
    per_epoch = CLIPS // BATCH
    assert len(batches) % per_epoch == 0
    by_key = {s["__key__"]: s for s in samples}
    for e in range(len(batches) // per_epoch):
        epoch = batches[e * per_epoch : (e + 1) * per_epoch]
        assert sorted(k for b in epoch for k in b["key"]) == sorted(by_key), f"epoch {e}"
    for batch in batches:
        assert batch["valid"].all() and batch["skipped"] == []
        assert batch["video"].shape == (BATCH, 8, 3, 32, 32)
        for row, key in enumerate(batch["key"]):
            video, audio = decode_direct(by_key[key])
            assert torch.equal(batch["video"][row], video), key
            assert torch.equal(batch["audio"][row], audio), key


def loader(url: str, *, num_workers: int = 0, **kw: Any) -> StreamingLoader:
    """Clips from the start of each sample, so a direct decode gives the same tensors."""
    return StreamingLoader(
        url, batch_size=BATCH, num_workers=num_workers, seed=3, clip_offset="start", **AV, **kw
    )


def test_our_loader_reads_webdataset_shards_by_brace_pattern(
    dataset: Path, wds_folder: Path
) -> None:
    ld = loader(f"{wds_folder}/shard-{{000000..000002}}.tar")
    assert ld.source.manifest.samples == CLIPS
    assert ld.source.manifest.modalities == ["video", "audio", "meta"]
    check_epochs(list(ld.batches(max_batches=2 * CLIPS // BATCH)), wds_samples(dataset))
    assert ld.stats().samples == 2 * CLIPS and ld.stats().skipped_samples == 0


def test_our_loader_reads_a_folder_of_webdataset_shards_in_worker_processes(
    dataset: Path, wds_folder: Path
) -> None:
    ld = loader(str(wds_folder), num_workers=2, modalities=("video", "audio", "meta"))
    batches = list(ld.batches(max_batches=2 * CLIPS // BATCH))
    check_epochs(batches, wds_samples(dataset))
    order = [int(k[-4:]) for b in batches for k in b["key"]]
    metas = [m["clip"] for b in batches for m in b["meta"]]
    assert [f"clip-{c:06d}" for c in metas] == [list(member_bytes(dataset))[i] for i in order]
    assert ld.stats().samples == 2 * CLIPS and ld.stats().video_frames == 2 * CLIPS * 8


def test_a_broken_member_in_a_webdataset_shard_is_skipped_and_reported(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A truncated mp4 and a garbage flac in shards ShardWriter wrote: exactly those
    two samples are skipped, named in batch["skipped"] and counted, every epoch;
    the rest still decode as they should."""
    samples = wds_samples(dataset)
    truncated, garbage = samples[2], samples[9]
    truncated["mp4"] = truncated["mp4"][: len(truncated["mp4"]) // 2]
    garbage["flac"] = b"fLaC" + np.random.default_rng(0).bytes(3000)
    folder = tmp_path / "broken"
    write_with_webdataset(folder, samples)
    bad = {
        f"{folder}/shard-000000.tar:{truncated['__key__']}",
        f"{folder}/shard-000002.tar:{garbage['__key__']}",
    }

    with caplog.at_level(logging.WARNING, logger="stoker.data"):
        ld = loader(str(folder))
        batches = list(ld.batches(max_batches=2 * CLIPS // BATCH))
    assert ld.source.manifest.modalities == ["video", "audio", "meta"]
    skipped = [s for b in batches for s in b["skipped"]]
    assert sorted(skipped) == sorted([*bad, *bad])  # once per epoch
    assert ld.stats().skipped_samples == 4 and ld.stats().samples == 2 * (CLIPS - 2)
    assert sum(int((~b["valid"]).sum()) for b in batches) == 4
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert truncated["__key__"] in logged and garbage["__key__"] in logged
    # The loader's skips carry the reason indexing found, not a symptom of it.
    skips = [r.getMessage() for r in caplog.records if "skipping sample" in r.getMessage()]
    assert len(skips) == 4 and not any("empty file" in m for m in skips)
    assert all(
        f"{truncated['__key__']}.mp4: " in m or f"{garbage['__key__']}.flac: " in m for m in skips
    )

    # A loader that wants video only has no use for the broken flac: that sample decodes.
    video_only = loader(str(folder), modalities=("video",))
    seen = [s for b in video_only.batches(max_batches=CLIPS // BATCH) for s in b["skipped"]]
    assert seen == [f"{folder}/shard-000000.tar:{truncated['__key__']}"]

    good = {s["__key__"]: s for s in samples if s is not truncated and s is not garbage}
    for batch in batches:
        assert batch["video"].shape == (BATCH, 8, 3, 32, 32)
        for row, key in enumerate(batch["key"]):
            if batch["valid"][row]:
                video, audio = decode_direct(good[key])
                assert torch.equal(batch["video"][row], video)
                assert torch.equal(batch["audio"][row], audio)
