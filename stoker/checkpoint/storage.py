"""DCP's storage readers and writers for a checkpoint folder URL: the plain
file system ones for local paths (shared file systems included: they fsync),
fsspec's for object stores and other URLs (s3://...)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stoker.checkpoint import commit as ck

if TYPE_CHECKING:
    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter


def storage_writer(url: str, fs_options: dict[str, Any] | None = None) -> StorageWriter:
    fs, path = ck._open(url, fs_options)
    if ck._is_local(fs):
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        return FileSystemWriter(path, sync_files=True)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    # An object is durable once its PUT returns: there is nothing to fsync.
    return FsspecWriter(url, sync_files=False, **(fs_options or {}))


def storage_reader(url: str, fs_options: dict[str, Any] | None = None) -> StorageReader:
    fs, path = ck._open(url, fs_options)
    if ck._is_local(fs):
        from torch.distributed.checkpoint.filesystem import FileSystemReader

        return FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(url, **(fs_options or {}))
