"""Where a data set writer reads or writes: a folder or fsspec URL opened as its
filesystem, the path on it and the protocol-qualified URL (SRC and DST of `data pack`
and `data encode`, and the work files of their array tasks)."""

from __future__ import annotations

from typing import Any


def open_location(url: str) -> tuple[Any, str, str]:
    """(filesystem, path on it, protocol-qualified URL) of a folder or fsspec URL."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/") or "/"
    return fs, root, fs.unstrip_protocol(root)
