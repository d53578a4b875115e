"""`DataSource`: a data set a loader can read, where it is and what its manifest says;
what `open_dataset` returns and the plain WebDataset index builds."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from stoker.data.format.shard_format import Manifest, ShardIndex, join, parse_index

# One filesystem object per process and URL protocol options: s3fs instances hold
# an event loop and connection pool, which must not cross a fork.
_FS_LOCK = threading.Lock()


@dataclass
class DataSource:
    """A data set a loader can read: where it is and what its manifest says."""

    url: str
    root: str
    """The root as a path on its filesystem (no protocol)."""
    manifest: Manifest
    storage_options: dict[str, Any] = field(default_factory=dict)
    indexes: dict[int, ShardIndex] | None = None
    """Indexes built in memory (plain WebDataset shards); None: read them beside the shards."""
    _fs: Any = field(default=None, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into DataLoader workers: the filesystem is re-made there.
        state = dict(self.__dict__)
        state["_fs"] = None
        return state

    @property
    def fs(self) -> Any:
        with _FS_LOCK:
            if self._fs is None:
                from fsspec.core import url_to_fs

                self._fs, _ = url_to_fs(self.url, **self.storage_options)
            return self._fs

    def shard_path(self, shard: int) -> str:
        return join(self.root, self.manifest.shards[shard].path)

    def index_path(self, shard: int) -> str:
        return join(self.root, self.manifest.shards[shard].index)

    def read_index(self, shard: int) -> ShardIndex:
        """The index of shard number `shard` (one GET; the caller retries)."""
        if self.indexes is not None:
            return self.indexes[shard]
        path = self.index_path(shard)
        return parse_index(self.fs.cat_file(path), f"{self.url} ({path})")
