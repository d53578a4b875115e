"""Local paths in an experiment, made absolute against the folder they were given in.

A job runs from its code snapshot (`<run>/code/...`) on another node, and reads only its
frozen config: a relative `data.url` would be read against the snapshot, not the folder
the user meant, and fail seconds into the run. So `resolve_config` anchors each relative
path before anything else sees it: one in an experiment file against that file's folder
(as `job.template` already was), one in the site profile against the profile's, one in
an override or a flag against the current folder; `~` is the user's home. URLs
(`s3://...`, `file://...`) are left as written, and so are absolute paths.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, TypeVar


class _Sourced(Protocol):
    @property
    def kind(self) -> str: ...


S = TypeVar("S", bound=_Sourced)
Assigned = tuple[tuple[str, ...], Any, S]
"""`resolve_config`'s leaf assignment: the key, the value, its source (of a `kind`)."""

PATH_KEYS: frozenset[tuple[str, ...]] = frozenset(
    {("data", "url"), ("data", "eval_url"), ("checkpoint", "root")}
)
"""The keys whose value is a folder or an fsspec URL."""
SOURCES_KEY = ("data", "sources")
"""A list of `{name, url, weight}`: each entry's url is a path too."""


def is_local_path(value: object) -> bool:
    """A path on this machine's file systems, not a URL (`s3://`, `file://`, `a::s3://`)."""
    return isinstance(value, str) and bool(value.strip()) and "://" not in value


def anchored(value: str, folder: Path) -> str:
    """`value` as an absolute path: `~` expanded, a relative one joined to `folder`."""
    path = os.path.expanduser(value)
    if os.path.isabs(path) and path == value:
        return value
    return os.path.normpath(os.path.join(folder, path))


def absolute_paths(
    assignments: list[Assigned[S]],
    *,
    experiment: Path | None,
    profile: Path | None,
    cwd: Path,
) -> list[Assigned[S]]:
    """The assignments with every relative local path made absolute against the folder
    of its source (see the module's docstring)."""
    folders = {
        "file": _folder_of(experiment, cwd),
        "profile": _folder_of(profile, cwd),
        "override": cwd,
        "flag": cwd,
    }
    result: list[Assigned[S]] = []
    for path, value, source in assignments:
        folder = folders.get(source.kind)
        if folder is not None:
            value = _anchor_value(path, value, folder)
        result.append((path, value, source))
    return result


def _anchor_value(path: tuple[str, ...], value: Any, folder: Path) -> Any:
    if path in PATH_KEYS and is_local_path(value):
        return anchored(value, folder)
    if path == SOURCES_KEY and isinstance(value, list):
        return [
            {**entry, "url": anchored(entry["url"], folder)}
            if isinstance(entry, dict) and is_local_path(entry.get("url"))
            else entry
            for entry in value
        ]
    return value


def _folder_of(file: Path | None, cwd: Path) -> Path | None:
    if file is None:
        return None
    return (cwd / file.expanduser()).resolve().parent
