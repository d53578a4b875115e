"""Write one shard: a WebDataset tar and its index, both or neither.

The tar is built in a local temporary file (a shard is at most a few hundred MB),
hashed while written, then uploaded; the index goes up only after the tar, so an
index on storage always describes a complete tar. `data pack` treats "index
present" as "shard finished" when it resumes.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from stoker.data.format.latent_format import LatentEntry
from stoker.data.format.shard_format import (
    FORMAT_VERSION,
    AudioInfo,
    Member,
    SampleEntry,
    ShardIndex,
    VideoInfo,
    check_key,
    dump,
    index_name_for,
)

# Fixed member metadata: equal inputs give byte-equal shards (and equal checksums).
_MTIME = 1_700_000_000


@dataclass
class SampleToWrite:
    """A sample on its way into a shard: members by extension, plus media facts."""

    key: str
    members: dict[str, bytes]
    video: VideoInfo | None = None
    audio: AudioInfo | None = None
    latent: LatentEntry | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class _HashingFile:
    """Write-through file that hashes and counts what passes."""

    def __init__(self, f: Any) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.size = 0

    def tell(self) -> int:
        return self.size

    def write(self, b: Any) -> int:
        data = bytes(b)
        self._f.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)


def _member_order(ext: str) -> tuple[int, str]:
    # Metadata first: a streaming reader sees what a sample is before its media.
    rank = {"json": 0, "txt": 1}.get(ext, 2)
    return rank, ext


def write_tar(samples: Iterable[SampleToWrite], f: Any) -> tuple[list[SampleEntry], int, str]:
    """Write `samples` as a tar into binary file `f`; return entries, size and sha256."""
    out = _HashingFile(f)
    entries: list[SampleEntry] = []
    seen: set[str] = set()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for sample in samples:
            check_key(sample.key)
            if sample.key in seen:
                raise ValueError(f"sample key {sample.key!r} appears twice in one shard")
            seen.add(sample.key)
            members: dict[str, Member] = {}
            for ext in sorted(sample.members, key=_member_order):
                data = sample.members[ext]
                info = tarfile.TarInfo(f"{sample.key}.{ext}")
                info.size = len(data)
                info.mtime = _MTIME
                info.mode = 0o644
                tar.addfile(info, io.BytesIO(data))
                # Write mode leaves info.offset_data unset: the data ends the member,
                # padded to a 512-byte block, right where the archive now stands.
                padded = -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                members[ext] = Member(offset=tar.offset - padded, size=len(data))
            entries.append(
                SampleEntry(
                    key=sample.key,
                    members=members,
                    video=sample.video,
                    audio=sample.audio,
                    latent=sample.latent,
                )
            )
    return entries, out.size, out.sha256.hexdigest()


def write_shard(
    fs: Any, path: str, samples: Iterable[SampleToWrite], *, version: int = FORMAT_VERSION
) -> ShardIndex:
    """Write the tar at `path` on filesystem `fs`, then its index (format `version`)
    beside it.

    `path` is a full path on `fs` ending in `.tar`. Returns the index written.
    """
    name = path.rsplit("/", 1)[-1]
    fd, tmp = tempfile.mkstemp(prefix=".stoker-shard-", suffix=".tar")
    try:
        with os.fdopen(fd, "wb") as f:
            entries, size, sha = write_tar(samples, f)
        index = ShardIndex(version=version, shard=name, bytes=size, sha256=sha, samples=entries)
        parent = path.rsplit("/", 1)[0] if "/" in path else ""
        if parent:
            fs.makedirs(parent, exist_ok=True)
        _put_atomic(fs, tmp, path)
        _pipe_atomic(fs, index_name_for(path), dump(index))
        return index
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _atomic(fs: Any, path: str, write: Callable[[str], None]) -> None:
    # Object stores make each PUT atomic; a local file system needs a rename.
    if not _is_local(fs):
        write(path)
        return
    tmp = f"{path}.{os.getpid()}.partial"
    write(tmp)
    fs.mv(tmp, path)


def _put_atomic(fs: Any, local_file: str, path: str) -> None:
    _atomic(fs, path, lambda target: fs.put_file(local_file, target))


def _pipe_atomic(fs: Any, path: str, data: bytes) -> None:
    _atomic(fs, path, lambda target: fs.pipe_file(target, data))


def write_json_atomic(fs: Any, path: str, data: bytes) -> None:
    """Replace `path` with `data` whole (the manifest: written last, read first)."""
    _pipe_atomic(fs, path, data)
