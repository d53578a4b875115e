"""The on-storage layout of a data set: WebDataset tar shards, an index beside each
shard, and one manifest at the root.

    ROOT/manifest.json                      what the reader reads first and only
    ROOT/shards/shard-000000.tar            <key>.mp4, <key>.flac, <key>.json, <key>.txt
    ROOT/shards/shard-000000.index.json     keys, byte offsets, sizes, media facts

The tar files are plain WebDataset shards (members grouped by key, the key being
the member name up to its first dot), so `webdataset` reads them unchanged. The
index gives each member's data offset, so a reader fetches one sample with one
range request instead of streaming the whole shard; the manifest lists every
shard, so nothing lists an object store at training time (a glob there lists the
whole prefix).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stoker.data.format.latent_format import LATENT_VERSION, EncodingRecord, LatentEntry
from stoker.errors import StokerError

FORMAT: Literal["stoker-av"] = "stoker-av"
INDEX_FORMAT: Literal["stoker-av-index"] = "stoker-av-index"
FORMAT_VERSION = 1
"""The version of a media data set; a latent data set's is LATENT_VERSION (2)."""
READS_VERSION = LATENT_VERSION
"""The newest version this stoker reads."""
MANIFEST_NAME = "manifest.json"
SHARDS_DIR = "shards"

# Extensions known as media. What a file holds decides its role (the probe's), not its
# name: an mp4 of audio only is a sample's audio. A sample has at most one video and
# one audio member (the video member's audio track serves when there is no audio file).
VIDEO_EXTS = ("mp4", "m4v", "mov", "mkv", "webm", "avi", "ts", "mpg", "mpeg")
AUDIO_EXTS = ("wav", "flac", "ogg", "oga", "opus", "mp3", "m4a", "aac", "aiff", "aif")
METADATA_EXT = "json"
CAPTION_EXT = "txt"

# WebDataset's grouping rule: the key is the member name up to the first dot of
# its last path component. So a key may hold "/" but no "." in that component.
_KEY = re.compile(r"^(?!/)(?!.*(?:^|/)\.\.?(?:/|$))[^.\x00]+$")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Member(_Model):
    """Where one member's bytes lie inside its shard."""

    offset: int = Field(ge=0)
    """Byte offset of the member's data (after its tar header)."""
    size: int = Field(ge=0)
    """Length of the member's data in bytes."""


class VideoInfo(_Model):
    """What a probe of the video stream found."""

    field: str
    """Member extension holding the video (mp4, mkv, webm, mov, ...)."""
    codec: str
    width: int = Field(ge=1)
    """Display width: after `rotation` (a portrait phone video is narrower than tall)."""
    height: int = Field(ge=1)
    """Display height, after `rotation`."""
    fps: float = Field(gt=0)
    frames: int = Field(ge=0)
    duration_s: float = Field(ge=0)
    keyframe_interval: int | None = None
    """Largest distance between keyframes in frames, when known: seeks cost up to this."""
    rotation: int = Field(default=0, ge=0, lt=360, multiple_of=90)
    """Clockwise degrees (0, 90, 180 or 270) that turn the stored frames upright, from
    the container's display matrix; `decode_video` applies it."""


class AudioInfo(_Model):
    """What a probe of the audio stream found."""

    field: str
    """Member extension holding the audio: an audio file (flac, wav, m4a, ...), or the
    video member (mp4, mkv, ...) whose audio track this is."""
    codec: str
    sample_rate: int = Field(ge=1)
    channels: int = Field(ge=1)
    frames: int = Field(ge=0)
    """Audio frames (samples per channel)."""
    duration_s: float = Field(ge=0)
    stream: int = Field(default=0, ge=0)
    """Which of the member's audio streams (counted from 0 among its audio streams):
    the track `stoker data pack --audio-stream` picked from a video container."""
    offset_s: float = 0.0
    """When the audio's first sample plays, in seconds after the first video frame of
    the same container (negative: before it); 0 for an audio file. For people and
    tools: the decoders read the same from the container and keep both in sync."""


class SampleEntry(_Model):
    """One sample of a shard: its key, its members and its media facts."""

    key: str
    members: dict[str, Member]
    """By extension: {"mp4": ..., "flac": ..., "json": ..., "txt": ...}."""
    video: VideoInfo | None = None
    audio: AudioInfo | None = None
    error: str | None = None
    """Why the sample cannot be decoded, when indexing already found out (a member of a
    plain WebDataset shard that failed its probe); the loader skips it with this reason."""
    latent: LatentEntry | None = None
    """A latent data set's sample (`stoker data encode`): its bucket and tensors."""

    def unreadable(self, modalities: tuple[str, ...]) -> str | None:
        """`error` if one of `modalities` needs the member it is about, else None."""
        if self.error is None:
            return None
        for info in (
            self.video if "video" in modalities else None,
            self.audio if "audio" in modalities else None,
        ):
            if info is not None and info.codec == UNREADABLE:
                return self.error
        return None

    @property
    def duration_s(self) -> float:
        """Playable length: the shorter stream when both exist."""
        durations = [m.duration_s for m in (self.video, self.audio) if m is not None]
        if self.latent is not None:
            durations.append(self.latent.clip_seconds)
        return min(durations) if durations else 0.0


class ShardIndex(_Model):
    """The index beside one shard."""

    format: Literal["stoker-av-index"] = INDEX_FORMAT
    version: int = FORMAT_VERSION
    shard: str
    """File name of the tar this index describes."""
    bytes: int = Field(ge=0)
    sha256: str
    samples: list[SampleEntry]


class ShardRecord(_Model):
    """A shard as the manifest lists it; paths are relative to the data set root."""

    path: str
    index: str
    bytes: int = Field(ge=0)
    sha256: str
    samples: int = Field(ge=0)
    duration_s: float = Field(ge=0)


class Totals(_Model):
    bytes: int = 0
    duration_s: float = 0.0
    video_frames: int = 0
    audio_seconds: float = 0.0


class Manifest(_Model):
    """The root of a data set. Reading a data set is reading this file."""

    format: Literal["stoker-av"] = FORMAT
    version: int = FORMAT_VERSION
    shards: list[ShardRecord]
    samples: int = Field(ge=0)
    fields: list[str]
    """Member extensions present in every sample."""
    modalities: list[str] = Field(default_factory=list)
    """What every sample has, of "video", "audio", "text", "meta": what a loader may ask for."""
    totals: Totals
    created_by: str = ""
    """Which command wrote it (e.g. "stoker data synth"), for people reading the file."""
    encoding: EncodingRecord | None = None
    """How a latent data set was made (stoker/data/format/latent_format.py); None for media."""

    def fingerprint(self) -> str:
        """Identity of the sample order's input: shard paths, sizes, checksums, counts."""
        h = hashlib.sha256()
        for s in self.shards:
            h.update(f"{s.path}\0{s.sha256}\0{s.samples}\n".encode())
        return h.hexdigest()[:16]


MODALITIES = ("video", "audio", "text", "meta", "latent")

UNREADABLE = "unreadable"
"""The codec an index records for a media member that failed its probe (see SampleEntry.error)."""


def modalities_of(sample: SampleEntry) -> set[str]:
    """Which of MODALITIES `sample` can give a loader."""
    has = set()
    if sample.video is not None:
        has.add("video")
    if sample.audio is not None:
        has.add("audio")
    if CAPTION_EXT in sample.members:
        has.add("text")
    if METADATA_EXT in sample.members:
        has.add("meta")
    if sample.latent is not None:
        has.add("latent")
    return has


def check_key(key: str) -> str:
    """`key` if WebDataset would group its members back under it; else a StokerError."""
    if not _KEY.match(key) or "\n" in key:
        raise StokerError(
            f"sample key {key!r} cannot name tar members: WebDataset splits a name at its "
            "first dot, so a key may hold '/' but no '.', and may not start with '/'",
            fix="replace dots in the key (data pack does: a.b.mp4 becomes key 'a_b')",
        )
    return key


def shard_file_name(number: int) -> str:
    return f"shard-{number:06d}.tar"


def index_name_for(shard_path: str) -> str:
    """`shards/shard-000000.tar` -> `shards/shard-000000.index.json`."""
    base = shard_path[: -len(".tar")] if shard_path.endswith(".tar") else shard_path
    return base + ".index.json"


def join(root: str, relative: str) -> str:
    """A path under the data set root, as the root's filesystem spells it."""
    return posixpath.join(root.rstrip("/"), relative) if root else relative


def record_for(index: ShardIndex, path: str) -> ShardRecord:
    """The manifest's line for a shard whose index is `index`, stored at `path`."""
    return ShardRecord(
        path=path,
        index=index_name_for(path),
        bytes=index.bytes,
        sha256=index.sha256,
        samples=len(index.samples),
        duration_s=round(sum(s.duration_s for s in index.samples), 6),
    )


def build_manifest(
    records: list[ShardRecord],
    indexes: list[ShardIndex],
    created_by: str,
    encoding: EncodingRecord | None = None,
) -> Manifest:
    """The manifest of shards `records`, whose indexes are `indexes` (same order); with
    `encoding`, a latent data set's (format version 2)."""
    fields: set[str] | None = None
    modalities: set[str] | None = None
    totals = {"bytes": 0, "duration_s": 0.0, "video_frames": 0, "audio_seconds": 0.0}
    for record, index in zip(records, indexes, strict=True):
        totals["bytes"] += record.bytes
        for sample in index.samples:
            names = set(sample.members)
            fields = names if fields is None else fields & names
            has = modalities_of(sample)
            modalities = has if modalities is None else modalities & has
            totals["duration_s"] += sample.duration_s
            if sample.video is not None:
                totals["video_frames"] += sample.video.frames
            if sample.audio is not None:
                totals["audio_seconds"] += sample.audio.duration_s
    return Manifest(
        shards=records,
        samples=sum(r.samples for r in records),
        fields=sorted(fields or ()),
        modalities=[m for m in MODALITIES if m in (modalities or ())],
        totals=Totals(
            bytes=int(totals["bytes"]),
            duration_s=round(totals["duration_s"], 6),
            video_frames=int(totals["video_frames"]),
            audio_seconds=round(totals["audio_seconds"], 6),
        ),
        created_by=created_by,
        encoding=encoding,
        version=FORMAT_VERSION if encoding is None else LATENT_VERSION,
    )


def dump(model: BaseModel) -> bytes:
    return (json.dumps(model.model_dump(mode="json"), indent=1) + "\n").encode()


def parse_manifest(raw: bytes, source: str) -> Manifest:
    manifest: Manifest = _parse(Manifest, raw, source, "manifest")
    return manifest


def parse_index(raw: bytes, source: str) -> ShardIndex:
    index: ShardIndex = _parse(ShardIndex, raw, source, "shard index")
    return index


def _parse(model: type[Any], raw: bytes, source: str, what: str) -> Any:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StokerError(
            f"{source}: not a stoker {what} (not JSON: {exc})",
            fix="point at the root of a data set written by `stoker data pack` or `data synth`",
        ) from exc
    if isinstance(doc, dict) and doc.get("version", FORMAT_VERSION) > READS_VERSION:
        raise StokerError(
            f"{source}: {what} format version {doc['version']} is newer than this stoker "
            f"reads ({READS_VERSION})",
            fix="upgrade stoker on this machine",
        )
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise StokerError(
            f"{source}: invalid {what}: {where}: {first['msg']}",
            fix="re-write the data set with `stoker data pack` (a partial copy loses files)",
        ) from exc
