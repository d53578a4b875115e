"""The shards a data set writer (`data pack`, `data encode`) has finished under its
destination, for a re-run to keep: a shard is finished when its index is on storage
(the writer puts it after the tar) and its tar has the size the index states."""

from __future__ import annotations

from typing import Any

from stoker.data.shard_format import (
    SHARDS_DIR,
    ShardIndex,
    index_name_for,
    join,
    parse_index,
    shard_file_name,
)
from stoker.errors import StokerError


def shard_path(number: int) -> str:
    """Shard `number`'s tar, relative to the data set root."""
    return f"{SHARDS_DIR}/{shard_file_name(number)}"


def read_index(fs: Any, root: str, number: int) -> ShardIndex:
    """The index of shard `number` under `root`; a StokerError when it does not parse."""
    path = join(root, index_name_for(shard_path(number)))
    return parse_index(fs.cat_file(path), path)


def finished_shards(fs: Any, root: str, numbers: range | list[int]) -> dict[int, ShardIndex]:
    """Of shards `numbers`, those whose index is on storage and whose tar has the size it
    states, with their indexes; a damaged index counts as unfinished (written again)."""
    folder = join(root, SHARDS_DIR)
    sizes = {
        path.rsplit("/", 1)[-1]: int(info.get("size") or 0)
        for path, info in (fs.find(folder, detail=True) if fs.exists(folder) else {}).items()
    }
    finished = {}
    for n in numbers:
        tar = shard_file_name(n)
        if index_name_for(tar) not in sizes or tar not in sizes:
            continue
        try:
            index = read_index(fs, root, n)
        except StokerError:
            continue
        if index.bytes == sizes[tar]:
            finished[n] = index
    return finished
