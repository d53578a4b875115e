"""`.npy` and `.safetensors` members of a sample reach the batch as tensors: real
shards with encoded video and audio beside the arrays, read by the real loader (in
this process and in worker processes), stacked where shapes agree."""

from __future__ import annotations

import io
import logging
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest
import torch
from safetensors.torch import save as save_safetensors

from stoker.data.format.shard_format import (
    MANIFEST_NAME,
    build_manifest,
    dump,
    join,
    parse_index,
    record_for,
    shard_file_name,
)
from stoker.data.media.decode import decode_array
from stoker.data.media.errors import MediaError
from stoker.data.stream.loader import StreamingLoader
from stoker.data.stream.worker import collate
from stoker.data.write.shard_writer import SampleToWrite, write_json_atomic, write_shard

CLIPS = 8
BATCH = 4
AV: dict[str, Any] = {"fps": 8, "size": (32, 32), "clip_seconds": 1.0, "sample_rate": 8000}


@pytest.fixture(scope="module")
def media(synthetic_av_set: Callable[..., Path]) -> list[SampleToWrite]:
    """The synthetic set's samples (real H.264 and FLAC), as bytes to write again."""
    root = synthetic_av_set(clips=CLIPS, size=(32, 32), sample_rate=8000, samples_per_shard=4)
    fs = fsspec.filesystem("file")
    out = []
    for shard in range(2):
        name = f"shards/shard-{shard:06d}"
        index = parse_index(fs.cat_file(join(str(root), f"{name}.index.json")), "t")
        tar = fs.cat_file(join(str(root), f"{name}.tar"))
        for e in index.samples:
            members = {ext: tar[m.offset : m.offset + m.size] for ext, m in e.members.items()}
            out.append(SampleToWrite(e.key, members, e.video, e.audio))
    assert len(out) == CLIPS
    return out


def clip_number(key: str) -> int:
    return int(key.split("-")[1])


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


# What each sample carries, as a function of its clip number: checkable in any row.
def features(c: int) -> np.ndarray:
    return np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * c


def ragged(c: int) -> np.ndarray:
    return np.full(1 + c % 3, c, dtype=">i4")  # big-endian, as some writers store it


def tensors(c: int) -> dict[str, torch.Tensor]:
    return {
        "emb": torch.linspace(0, 1, 5) * c,
        "ids": torch.tensor([c, c + 1], dtype=torch.int64),
    }


def with_arrays(samples: list[SampleToWrite]) -> list[SampleToWrite]:
    out = []
    for s in samples:
        c = clip_number(s.key)
        members = {
            **s.members,
            "npy": npy(features(c)),
            "ragged.npy": npy(ragged(c)),
            "safetensors": save_safetensors(tensors(c)),
        }
        out.append(SampleToWrite(s.key, members, s.video, s.audio))
    return out


def write_set(root: Path, shards: list[list[SampleToWrite]]) -> str:
    fs = fsspec.filesystem("file")
    records, indexes = [], []
    for i, samples in enumerate(shards):
        path = f"shards/{shard_file_name(i)}"
        index = write_shard(fs, str(root / path), samples)
        records.append(record_for(index, path))
        indexes.append(index)
    write_json_atomic(fs, str(root / MANIFEST_NAME), dump(build_manifest(records, indexes, "test")))
    return str(root)


def loader(url: str, **kw: Any) -> StreamingLoader:
    return StreamingLoader(url, **{"batch_size": BATCH, "num_workers": 0, "seed": 5, **AV, **kw})


def check_rows(batch: dict[str, Any]) -> None:
    """Every row's arrays are those of the sample its key names, stacked where they can be."""
    clips = [clip_number(k) for k in batch["key"]]
    assert batch["npy"].shape == (BATCH, 2, 3) and batch["npy"].dtype == torch.float32
    assert torch.equal(batch["npy"], torch.from_numpy(np.stack([features(c) for c in clips])))
    st = batch["safetensors"]
    assert set(st) == {"emb", "ids"}
    assert st["emb"].shape == (BATCH, 5) and st["ids"].shape == (BATCH, 2)
    assert st["ids"].dtype == torch.int64
    assert torch.equal(st["ids"], torch.stack([tensors(c)["ids"] for c in clips]))
    assert torch.allclose(st["emb"], torch.stack([tensors(c)["emb"] for c in clips]))
    # Shapes that differ between rows stay a list of tensors, in native byte order.
    rows = batch["ragged.npy"]
    if len({len(ragged(c)) for c in clips}) > 1:
        assert isinstance(rows, list) and len(rows) == BATCH
    else:  # this batch's rows happen to agree
        assert isinstance(rows, torch.Tensor) and rows.shape == (BATCH, len(ragged(clips[0])))
    for row, c in zip(rows, clips, strict=True):
        assert row.dtype == torch.int32 and row.tolist() == ragged(c).tolist()
    assert batch["video"].shape == (BATCH, 8, 3, 32, 32)  # the media still decode beside them


def test_array_members_reach_the_batch_as_tensors(
    media: list[SampleToWrite], tmp_path: Path
) -> None:
    url = write_set(tmp_path / "set", [with_arrays(media[:4]), with_arrays(media[4:])])
    ld = loader(url, modalities=("video", "audio"))
    batches = list(ld.batches(max_batches=CLIPS // BATCH))
    for batch in batches:
        assert batch["valid"].all()
        check_rows(batch)
        assert isinstance(batch["ragged.npy"], list)  # 4 clips: at most 3 share a length
    assert sorted(k for b in batches for k in b["key"]) == sorted(s.key for s in media)


def test_array_members_pass_through_worker_processes(
    media: list[SampleToWrite], tmp_path: Path
) -> None:
    url = write_set(tmp_path / "set", [with_arrays(media[:4]), with_arrays(media[4:])])
    ld = loader(url, num_workers=2, modalities=("audio",))
    batches = list(ld.batches(max_batches=4))
    assert len(batches) == 4 and ld.stats().samples == 4 * BATCH
    for batch in batches:
        check_rows({**batch, "video": torch.zeros(BATCH, 8, 3, 32, 32)})
        assert "video" not in batch  # not asked for: only the arrays pass regardless


def test_a_padding_row_carries_the_arrays_of_the_sample_it_copies(
    media: list[SampleToWrite], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A truncated mp4 and an unreadable .npy: both samples are skipped like any
    corrupt sample, and their rows hold a good sample's video and arrays alike."""
    samples = with_arrays(media[:4])
    truncated, garbage = samples[1], samples[2]
    truncated.members["mp4"] = truncated.members["mp4"][: len(truncated.members["mp4"]) // 2]
    garbage.members["npy"] = b"\x93NUMPY\x01\x00" + b"{'descr': '<f4', 'fortran_order'"
    url = write_set(tmp_path / "set", [samples])
    with caplog.at_level(logging.WARNING, logger="stoker.data"):
        ld = loader(url, modalities=("video",))
        batch = next(iter(ld))
    assert int((~batch["valid"]).sum()) == 2 and ld.stats().skipped_samples == 2
    assert set(batch["skipped"]) == {
        f"shards/shard-000000.tar:{truncated.key}",
        f"shards/shard-000000.tar:{garbage.key}",
    }
    assert truncated.key not in batch["key"] and garbage.key not in batch["key"]
    check_rows(batch)  # the copies' arrays match the copies' keys
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert f"{garbage.key!r}" in logged and "unreadable .npy" in logged


def test_plain_webdataset_shards_pass_arrays_every_sample_has(
    media: list[SampleToWrite], tmp_path: Path
) -> None:
    """A tar written with tarfile (no index, no manifest): members every sample has
    pass through; one that only some samples have does not (a batch needs it in
    every row)."""
    folder = tmp_path / "wds"
    folder.mkdir()
    with tarfile.open(folder / "shard-000000.tar", "w") as tar:
        for i, s in enumerate(with_arrays(media[:4])):
            members = dict(s.members)
            if i % 2:
                members["extra.npy"] = npy(np.zeros(3, dtype=np.float32))
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{s.key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    ld = loader(str(folder), modalities=("audio", "meta"))
    batch = next(iter(ld))
    check_rows({**batch, "video": torch.zeros(BATCH, 8, 3, 32, 32)})
    assert "extra.npy" not in batch
    assert [m["clip"] for m in batch["meta"]] == [clip_number(k) for k in batch["key"]]


def test_decode_array_refuses_pickles_and_what_is_not_one_array() -> None:
    with pytest.raises(MediaError, match="allow_pickle"):
        decode_array(npy_object(), "npy")
    archive = io.BytesIO()
    np.savez(archive, a=np.zeros(2))
    with pytest.raises(MediaError, match="not one array"):
        decode_array(archive.getvalue(), "x.npy")
    with pytest.raises(MediaError, match="no tensor has"):
        decode_array(npy(np.array(["a", "bc"])), "npy")
    with pytest.raises(MediaError, match=r"unreadable \.safetensors"):
        decode_array(b"\x08\x00\x00\x00\x00\x00\x00\x00{}", "safetensors")
    fortran = np.asfortranarray(np.arange(6, dtype=np.int16).reshape(2, 3))
    out = decode_array(npy(fortran), "npy")
    assert isinstance(out, torch.Tensor) and out.tolist() == [[0, 1, 2], [3, 4, 5]]


def test_safetensors_members_read_as_safetensors_reads_them() -> None:
    """Read in place (no copy per tensor), with safetensors' own checks: every dtype and
    shape as saved, and a truncated or padded member refused, naming the member."""
    tensors = {
        "video": torch.randn(2, 3, 4).to(torch.float16),
        "ids": torch.arange(5),
        "mask": torch.tensor([True, False]),
        "empty": torch.zeros(0, 3),
        "scale": torch.tensor(0.5, dtype=torch.bfloat16),
    }
    data = save_safetensors(tensors, metadata={"encoder": "tiny"})
    out = decode_array(data, "latent.safetensors")
    assert isinstance(out, dict) and out.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor), name
    for broken in (data[:-1], data + b"\0", data[:6]):
        with pytest.raises(MediaError, match=r"unreadable \.latent\.safetensors"):
            decode_array(broken, "latent.safetensors")


def npy_object() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return buffer.getvalue()


def test_collate_stacks_only_equal_shapes_and_dtypes() -> None:
    a, b = torch.zeros(2), torch.ones(2)
    assert collate([a, b]).shape == (2, 2)
    mixed = collate([a, b.to(torch.int64)])
    assert isinstance(mixed, list) and mixed[1].dtype == torch.int64
    same = collate([{"x": a}, {"x": b}])
    assert isinstance(same, dict) and same["x"].shape == (2, 2)
    differ = collate([{"x": a}, {"y": b}])
    assert isinstance(differ, list) and differ[1] == {"y": b}
    assert collate([{"clip": 1}, {"clip": 2}]) == [{"clip": 1}, {"clip": 2}]  # .json stays dicts
