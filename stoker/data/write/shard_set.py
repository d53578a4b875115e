"""The shards a data set writer (`data pack`, `data encode`) has finished under its
destination, for a re-run to keep: a shard is finished when its index is on storage
(the writer puts it after the tar) and its tar has the size the index states; and the
manifest both write once every shard is there (`write_manifest`)."""

from __future__ import annotations

from typing import Any

from stoker.data.format.latent_format import EncodingRecord
from stoker.data.format.shard_format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    Manifest,
    ShardIndex,
    build_manifest,
    dump,
    index_name_for,
    join,
    parse_index,
    record_for,
    shard_file_name,
)
from stoker.data.write.shard_writer import write_json_atomic
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


def write_manifest(
    fs: Any,
    root: str,
    indexes: dict[int, ShardIndex],
    created_by: str,
    encoding: EncodingRecord | None = None,
) -> Manifest:
    """The manifest of every planned shard (`indexes`: all of them, by number), written
    under `root`: the last step of `data pack` and `data encode`. A function of the
    shards alone, so every writer of it (whichever array task ends last) writes the
    same bytes; a shard that lost all its samples is left out."""
    numbers = [n for n in sorted(indexes) if indexes[n].samples]
    records = [record_for(indexes[n], shard_path(n)) for n in numbers]
    manifest = build_manifest(
        records, [indexes[n] for n in numbers], created_by=created_by, encoding=encoding
    )
    write_json_atomic(fs, join(root, MANIFEST_NAME), dump(manifest))
    return manifest
