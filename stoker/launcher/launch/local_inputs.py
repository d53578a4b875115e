"""What a job will read from the file systems this machine sees, checked before it is
queued: a missing data set or script would otherwise fail the job seconds after it
starts, after its wait in the queue. Only what is cheap to ask here (a few `stat`s):
local data sets (`stoker check` also reads their manifests), the checkpoint root's
folder, the script of a plain command. URLs (`s3://...`) are left to `stoker check`.

Each check raises a StokerError naming the value, where it came from and the fix.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from stoker.config import ResolvedConfig
from stoker.errors import StokerError

_PYTHON = re.compile(r"python(\d+(\.\d+)?)?")
# Python's options that take the next argument as their value (`python -X dev x.py`).
_OPTIONS_WITH_VALUE = frozenset({"-W", "-X", "--check-hash-based-pycs"})


def check_local_inputs(
    resolved: ResolvedConfig, command: Sequence[object], code_folder: Path
) -> None:
    """The local data sets and checkpoint root of `resolved`, and the script a plain
    `command` runs (relative to `code_folder`, the folder its snapshot is made of)."""
    check_local_data(resolved)
    check_checkpoint_folder(resolved)
    check_script(command, code_folder, in_container=resolved.config.job.container is not None)


def check_local_data(resolved: ResolvedConfig) -> None:
    """Each local data set the job reads is there: a folder with a manifest (or tar
    shards), or one tar file. A brace pattern of shards is left to the loader."""
    data = resolved.config.data
    named = [(data.url, "data.url", ("data", "url"))]
    named += [
        (source.url, f"data.sources[{i}] ({source.name}) url", ("data", "sources"))
        for i, source in enumerate(data.sources)
    ]
    named.append((data.eval_url, "data.eval_url", ("data", "eval_url")))
    for url, key, path in named:
        if url is None or "://" in url or ("{" in url and "}" in url):
            continue
        local = host_path(url, resolved)
        if local is None:
            continue
        problem = _not_a_data_set(local)
        if problem:
            if str(local) != url:
                problem = f"(at {local} on this machine, through job.mounts) {problem}"
            shown = shlex.quote(str(local))  # pasted into a shell, here
            raise StokerError(
                f"{key} {url!r} ({resolved.source_of(path)}) {problem}: the job would fail "
                "as it opens it; nothing was submitted",
                fix=f"write a data set there (`stoker data pack SRC {shown}` or `stoker data "
                f"synth {shown}`), or set {key.split(' ')[0]} to one; a relative path is "
                "relative to the experiment file's folder, or to the current folder in an "
                "override; a path only the compute nodes see: --no-check",
            )


def host_path(path: str, resolved: ResolvedConfig) -> Path | None:
    """Where the job's `path` is on this machine: the path itself, or in a container job
    the host side of the job.mounts entry (`host:container[:ro]`) that holds it. None for
    a container path no mount holds: the image's own, or one its runtime binds, which only
    the job sees."""
    if resolved.config.job.container is None:
        return Path(path)
    inside = PurePosixPath(path)
    held = []
    for mount in resolved.config.job.mounts:
        host, target = mount.split(":")[:2]
        if inside.is_relative_to(target):
            held.append((len(PurePosixPath(target).parts), Path(host) / inside.relative_to(target)))
    return max(held, key=lambda found: found[0])[1] if held else None


def _not_a_data_set(path: Path) -> str | None:
    from stoker.data.format.shard_format import MANIFEST_NAME

    if path.is_dir():
        if (path / MANIFEST_NAME).is_file():
            return None
        with os.scandir(path) as entries:
            if any(entry.name.endswith(".tar") for entry in entries):
                return None
        return f"holds no data set ({MANIFEST_NAME} is missing, and no .tar shards)"
    if path.is_file():
        return None if path.name.endswith(".tar") else "is a file, not a data set's folder"
    return "does not exist"


def check_checkpoint_folder(resolved: ResolvedConfig) -> None:
    """A local checkpoint.root can be made and written: the nearest folder of it that
    exists is a folder this user may write into."""
    root = resolved.config.checkpoint.root
    if root is None or "://" in root:
        return
    path = host_path(root, resolved)
    if path is None:
        return
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is None:  # pragma: no cover - "/" exists
        return
    where = resolved.source_of(("checkpoint", "root"))
    if not existing.is_dir():
        raise StokerError(
            f"checkpoint.root {root!r} ({where}): {existing} is a file, not a folder",
            fix="set checkpoint.root to a folder (or null: <run folder>/checkpoints)",
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StokerError(
            f"checkpoint.root {root!r} ({where}): this user may not write into {existing}",
            fix="set checkpoint.root to a folder you can write (or null: <run folder>/checkpoints)",
        )


def script_of(command: Sequence[object]) -> str | None:
    """The script file `python [options] X.py [args]` runs; None for `python -m`/`-c`,
    a command that is not Python, or one that reads stdin."""
    if len(command) < 2 or not isinstance(command[0], str):
        return None
    if not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    args = iter(command[1:])
    for arg in args:
        if not isinstance(arg, str):
            return None
        if arg in ("-m", "-c", "-"):
            return None
        if arg in _OPTIONS_WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def check_script(command: Sequence[object], code_folder: Path, *, in_container: bool) -> None:
    """The script of `python X.py` is there: relative to the folder the job runs from
    (the snapshot of `code_folder`), or absolute on this machine. An absolute path in a
    container job may be the image's, and is not checked."""
    script = script_of(command)
    if script is None or (in_container and os.path.isabs(script)):
        return
    path = code_folder / os.path.expanduser(script)
    if path.is_file():
        return
    shown = " ".join(str(arg) for arg in command)
    raise StokerError(
        f"the command `{shown}` runs {script}, but {path} "
        f"{'is not a file' if path.exists() else 'does not exist'}; nothing was submitted",
        fix=f"run it from the folder that holds {script} (the job runs from a snapshot of the "
        "current folder), or give its path, e.g. `-- python examples/own_loop/train.py`",
    )
