"""Index plain WebDataset shards (tar files without our index or manifest) in memory,
so the streaming loader reads them like a packed data set.

Each shard is read once, start to end, at loader start: member offsets come from
the tar headers, media facts from probing each video and audio member (a video
member's first audio track is the sample's audio unless an audio member is there). For a
large set, `stoker data pack` the shards once instead: its index lives beside
them and the loader then reads only the manifest at start.
"""

from __future__ import annotations

import hashlib
import logging
import posixpath
import re
import tarfile
from collections.abc import Iterator
from typing import IO, Any

from stoker.data.format.shard_format import (
    AUDIO_EXTS,
    UNREADABLE,
    VIDEO_EXTS,
    AudioInfo,
    Member,
    SampleEntry,
    ShardIndex,
    VideoInfo,
    build_manifest,
    record_for,
)
from stoker.data.media.errors import MediaError
from stoker.data.media.probe import MediaProbe, probe_media
from stoker.data.sets.source import DataSource
from stoker.errors import StokerError

log = logging.getLogger("stoker.data")


_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """`a-{000..002}.tar` -> a-000.tar, a-001.tar, a-002.tar; `{x,y}` lists too
    (WebDataset's shard URL notation)."""
    m = _RANGE.search(pattern)
    if m:
        lo, hi = m.group(1), m.group(2)
        width = len(lo) if lo.startswith("0") else 0
        out = []
        for i in range(int(lo), int(hi) + 1):
            out += expand_braces(pattern[: m.start()] + str(i).zfill(width) + pattern[m.end() :])
        return out
    m = _CHOICE.search(pattern)
    if m:
        out = []
        for choice in m.group(1).split(","):
            out += expand_braces(pattern[: m.start()] + choice + pattern[m.end() :])
        return out
    return [pattern]


def split_member_name(name: str) -> tuple[str, str] | None:
    """(key, extension) by WebDataset's rule: the key ends at the first dot of the
    last path component. None for names that are not sample members."""
    directory, base = posixpath.split(name)
    if "." not in base or base.startswith("."):
        return None
    stem, ext = base.split(".", 1)
    return posixpath.join(directory, stem) if directory else stem, ext.lower()


class _HashingReader:
    def __init__(self, f: IO[bytes]) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._f.read(n)
        self.sha256.update(data)
        self.size += len(data)
        return data


def _members(f: IO[bytes]) -> Iterator[tuple[str, str, int, bytes]]:
    with tarfile.open(fileobj=f, mode="r|") as tar:
        for info in tar:
            if not info.isfile():
                continue
            split = split_member_name(info.name)
            if split is None:
                continue
            extracted = tar.extractfile(info)
            data = extracted.read() if extracted is not None else b""
            yield split[0], split[1], info.offset_data, data


def _unreadable(ext: str) -> VideoInfo | AudioInfo:
    if ext in VIDEO_EXTS:
        return VideoInfo(
            field=ext, codec=UNREADABLE, width=1, height=1, fps=1.0, frames=0, duration_s=0.0
        )
    return AudioInfo(
        field=ext, codec=UNREADABLE, sample_rate=1, channels=1, frames=0, duration_s=0.0
    )


def _take(sample: dict[str, Any], probe: MediaProbe) -> None:
    """Record a member's probe in `sample`: its video, and its audio unless an audio
    member (not a video's track) or a readable one is there already; an audio member
    replaces a video's track, as `stoker data pack` prefers the audio file."""
    held = sample["video"]
    if probe.video is not None and (held is None or held.codec == UNREADABLE):
        sample["video"] = probe.video
    held = sample["audio"]
    if probe.audio is None:
        return
    is_track = probe.video is not None
    held_is_track = (
        held is not None and sample["video"] is not None and (held.field == sample["video"].field)
    )
    if held is None or held.codec == UNREADABLE or (held_is_track and not is_track):
        sample["audio"] = probe.audio


def index_tar(f: IO[bytes], name: str, source: str) -> ShardIndex:
    """Index one WebDataset tar read from `f` (sequentially, once)."""
    reader = _HashingReader(f)
    samples: dict[str, dict[str, Any]] = {}
    try:
        for key, ext, offset, data in _members(reader):  # type: ignore[arg-type]
            sample = samples.setdefault(
                key, {"members": {}, "video": None, "audio": None, "error": None}
            )
            sample["members"][ext] = Member(offset=offset, size=len(data))
            if ext not in VIDEO_EXTS and ext not in AUDIO_EXTS:
                continue
            try:
                probe = probe_media(data, ext)
            except MediaError as exc:
                # Keep the sample with a stand-in for the member: one bad file must not
                # drop video (or audio) from every sample's modalities, which would
                # refuse the whole set. The entry's error makes the loader skip the
                # sample with this reason, and name it in batch["skipped"].
                log.warning("stoker.data: %s: %s.%s is unreadable: %s", source, key, ext, exc)
                sample["error"] = f"{key}.{ext}: {exc}"
                role = "video" if ext in VIDEO_EXTS else "audio"
                if sample[role] is None or sample[role].codec == UNREADABLE:
                    sample[role] = _unreadable(ext)
                continue
            _take(sample, probe)
        while reader.read(1 << 20):  # the tail (end-of-archive blocks): hash all bytes
            pass
    except tarfile.TarError as exc:
        raise StokerError(
            f"{source}: not a readable tar ({exc})",
            fix="check the shard URL; a partial upload leaves a truncated tar",
        ) from exc
    entries = [
        SampleEntry(
            key=key, members=s["members"], video=s["video"], audio=s["audio"], error=s["error"]
        )
        for key, s in samples.items()
    ]
    return ShardIndex(
        shard=name, bytes=reader.size, sha256=reader.sha256.hexdigest(), samples=entries
    )


def index_plain_shards(url: str, storage_options: dict[str, Any]) -> DataSource:
    """A DataSource over WebDataset tars at `url` (a .tar, a brace pattern, or a
    folder of .tar files), with indexes and manifest built in memory."""
    from fsspec.core import url_to_fs

    fs, _ = url_to_fs(expand_braces(url)[0], **storage_options)
    paths: list[str] = []
    for pattern in expand_braces(url):
        _, path = url_to_fs(pattern, **storage_options)
        paths.append(path)
    if len(paths) == 1 and not paths[0].endswith(".tar"):
        folder = paths[0].rstrip("/")
        paths = sorted(p for p in fs.ls(folder, detail=False) if str(p).endswith(".tar"))
    indexes: list[ShardIndex] = []
    records = []
    for path in paths:
        try:
            with fs.open(path, "rb", block_size=8 << 20) as f:
                index = index_tar(f, posixpath.basename(path), f"{url} ({path})")
        except FileNotFoundError:
            raise StokerError(
                f"WebDataset shard {path} (from {url!r}) does not exist",
                fix="check the URL and brace pattern, e.g. shards-{000000..000009}.tar",
            ) from None
        indexes.append(index)
        records.append(record_for(index, path))
    manifest = build_manifest(records, indexes, created_by="stoker (indexed plain WebDataset)")
    if manifest.samples == 0:
        raise StokerError(f"the WebDataset shards at {url!r} hold no samples")
    return DataSource(
        url=url,
        root="",
        manifest=manifest,
        storage_options=storage_options,
        indexes=dict(enumerate(indexes)),
        _fs=fs,
    )
