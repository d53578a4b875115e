"""COMMIT.json: what makes a checkpoint folder loadable, and the checks against it.

DCP writes the shards and then `.metadata`; after that the coordinator writes
COMMIT.json listing every file in `step-<N>/` with its size and sha256. A folder
without a valid COMMIT.json is never loaded. COMMIT.json is replaced whole: by
temp file + fsync + rename on a local or shared file system, and as the last
object written on an object store (each PUT is atomic there).

Works on any fsspec URL (local paths, s3://); imports no torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stoker.errors import StokerError

FORMAT_VERSION = 1
COMMIT_NAME = "COMMIT.json"
METADATA_NAME = ".metadata"
CONFIG_NAME = "config.yaml"
"""The frozen experiment that saved the checkpoint, beside its shards (listed and hashed
in COMMIT.json like them): what `stoker sample` and `stoker ckpt export --register`
read when the checkpoint is used without its run folder."""
MEASURED_NAME = "measured-steps.json"
"""What the run's steps measured up to the commit (stoker/runtime/observe/step_memory.py),
beside the config: what `stoker plan --calibrate CKPT` holds the plan against."""
_CHUNK = 8 << 20  # sha256 streamed in 8 MiB reads: shards are GBs, memory stays flat
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class FileEntry:
    path: str
    """Relative to the checkpoint folder, '/'-separated."""
    size: int
    sha256: str


@dataclass(frozen=True)
class Commit:
    step: int
    world_size: int
    mesh: dict[str, Any] | None
    state_hash: str | None
    """stoker.config.state_hash of the experiment that saved it (COMMIT.json key
    `config_hash`, kept for the checkpoints already written)."""
    torch_version: str
    format_version: int
    created: str
    """UTC time the commit was written, ISO 8601."""
    files: tuple[FileEntry, ...]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        data = asdict(self)
        data["files"] = [asdict(f) for f in self.files]
        data["config_hash"] = data.pop("state_hash")
        return json.dumps(data, indent=1, sort_keys=True) + "\n"


@dataclass(frozen=True)
class Problem:
    file: str
    """Relative path of the file at fault (COMMIT.json for the folder itself)."""
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Row:
    step: int
    path: str
    committed: bool
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _open(url: str, fs_options: dict[str, Any] | None) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url, **(fs_options or {}))
    except (ImportError, ValueError) as exc:
        raise StokerError(
            f"checkpoint URL {url!r}: {exc}",
            fix="install the filesystem's package (s3: pip install 'stoker[s3]') or fix the URL",
        ) from exc
    return fs, path.rstrip("/") or "/"


def _is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def _url(fs: Any, path: str) -> str:
    return path if _is_local(fs) else str(fs.unstrip_protocol(path))


def _files(fs: Any, folder: str) -> dict[str, int]:
    """Every file under folder (relative path -> size), COMMIT.json and its temps left out."""
    fs.invalidate_cache(folder)  # verify what the store holds now, not a cached listing
    found = fs.find(folder, withdirs=False, detail=True)
    files = {}
    for path, info in found.items():
        rel = path[len(folder) :].lstrip("/")
        if rel.split("/")[-1].lstrip(".").startswith(COMMIT_NAME):
            continue
        files[rel] = int(info["size"])
    return files


def _sha256(fs: Any, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _torch_version() -> str:
    # The installed distribution's version: no `import torch` (seconds) for a string.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return "unknown"


def _known_sha(known: dict[str, tuple[int, str]], rel: str, size: int) -> str | None:
    """The writer's hash, if it hashed a file of this very size."""
    entry = known.get(rel)
    return entry[1] if entry is not None and entry[0] == size else None


def write_commit(
    folder_url: str,
    *,
    step: int,
    world_size: int,
    mesh: dict[str, Any] | None = None,
    state_hash: str | None = None,
    extra: dict[str, Any] | None = None,
    known: dict[str, tuple[int, str]] | None = None,
    fs_options: dict[str, Any] | None = None,
    texts: dict[str, str] | None = None,
) -> Commit:
    """Hash every file of a finished DCP save and write COMMIT.json (coordinator only).

    `known`: (size, sha256) by relative path, as the ranks that wrote the files
    hashed them (hash_files); a file whose size differs, or that is not in it,
    is hashed here. `texts`: small files written into the folder first (CONFIG_NAME,
    MEASURED_NAME),
    then listed and hashed with the shards."""
    fs, folder = _open(folder_url, fs_options)
    if not fs.isdir(folder):
        raise StokerError(
            f"no checkpoint folder at {folder_url!r}",
            fix="commit a folder that a DCP save has written",
        )
    if METADATA_NAME not in _files(fs, folder):
        raise StokerError(
            f"cannot commit {folder_url!r}: DCP has not finished: no {METADATA_NAME}",
            fix="commit only after every rank's save has returned (the coordinator "
            "writes .metadata last)",
        )
    for name, text in (texts or {}).items():
        fs.pipe_file(f"{folder}/{name}", text.encode())
    sizes = _files(fs, folder)
    known = known or {}
    entries = tuple(
        FileEntry(
            rel,
            size,
            sha if (sha := _known_sha(known, rel, size)) else _sha256(fs, f"{folder}/{rel}"),
        )
        for rel, size in sorted(sizes.items())
    )
    commit = Commit(
        step=step,
        world_size=world_size,
        mesh=mesh,
        state_hash=state_hash,
        torch_version=_torch_version(),
        format_version=FORMAT_VERSION,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        files=entries,
        extra=dict(extra or {}),
    )
    target = f"{folder}/{COMMIT_NAME}"
    if _is_local(fs):
        from stoker.atomic_write import write_text_atomic

        write_text_atomic(Path(target), commit.to_json())
    else:
        fs.pipe_file(target, commit.to_json().encode())
    return commit


def hash_files(
    folder_url: str, names: list[str], *, fs_options: dict[str, Any] | None = None
) -> dict[str, tuple[int, str]]:
    """(size, sha256) of these files of the folder (relative paths): each rank
    hashes what it wrote, so the coordinator does not read every shard back."""
    fs, folder = _open(folder_url, fs_options)
    out = {}
    for rel in names:
        path = f"{folder}/{rel}"
        out[rel] = (int(fs.size(path)), _sha256(fs, path))
    return out


def file_names(folder_url: str, *, fs_options: dict[str, Any] | None = None) -> list[str]:
    """Relative paths of the folder's files, COMMIT.json left out."""
    fs, folder = _open(folder_url, fs_options)
    return sorted(_files(fs, folder)) if fs.isdir(folder) else []


def _parse(raw: bytes, where: str) -> Commit:
    try:
        data = json.loads(raw)
        version = int(data["format_version"])
        if version > FORMAT_VERSION:
            raise StokerError(
                f"{where}: format version {version} is newer than this stoker reads "
                f"({FORMAT_VERSION})",
                fix="upgrade stoker to the version that wrote this checkpoint",
            )
        files = tuple(
            FileEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in data["files"]
        )
        return Commit(
            step=int(data["step"]),
            world_size=int(data["world_size"]),
            mesh=data.get("mesh"),
            state_hash=data.get("config_hash"),
            torch_version=str(data["torch_version"]),
            format_version=version,
            created=str(data["created"]),
            files=files,
            extra=dict(data.get("extra") or {}),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise StokerError(
            f"{where} is not a valid commit record ({type(exc).__name__}: {exc})",
            fix="the checkpoint cannot be trusted: delete its folder, or commit it again "
            "if its DCP save finished",
        ) from None


def read_commit(folder_url: str, *, fs_options: dict[str, Any] | None = None) -> Commit | None:
    """The folder's commit record; None when it has none."""
    fs, folder = _open(folder_url, fs_options)
    target = f"{folder}/{COMMIT_NAME}"
    # A cached listing of the folder from before the commit would answer "not
    # found" (s3fs sizes the object from it): this clears the path and its parents.
    fs.invalidate_cache(target)
    try:
        raw = fs.cat_file(target)
    except FileNotFoundError:
        return None
    return _parse(raw, _url(fs, target))


def verify(
    folder_url: str, *, full: bool, fs_options: dict[str, Any] | None = None
) -> list[Problem]:
    """What differs from COMMIT.json: sizes always, sha256 too when `full`. Empty: verified."""
    fs, folder = _open(folder_url, fs_options)
    try:
        commit = read_commit(folder_url, fs_options=fs_options)
    except StokerError as exc:
        return [Problem(COMMIT_NAME, exc.message)]
    if commit is None:
        return [Problem(COMMIT_NAME, "not committed: no COMMIT.json")]
    present = _files(fs, folder) if fs.isdir(folder) else {}
    problems = []
    for entry in commit.files:
        size = present.get(entry.path)
        if size is None:
            problems.append(Problem(entry.path, f"{entry.path}: missing"))
        elif size != entry.size:
            problems.append(
                Problem(entry.path, f"{entry.path}: size {size} != {entry.size} in COMMIT.json")
            )
        elif full:
            sha = _sha256(fs, f"{folder}/{entry.path}")
            if sha != entry.sha256:
                problems.append(
                    Problem(
                        entry.path, f"{entry.path}: sha256 {sha} != {entry.sha256} in COMMIT.json"
                    )
                )
    return problems


def step_of(url: str) -> int | None:
    """N for a URL whose last part is `step-<N>`; None otherwise."""
    match = _STEP_DIR.match(url.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def exists(url: str, *, fs_options: dict[str, Any] | None = None) -> bool:
    fs, path = _open(url, fs_options)
    fs.invalidate_cache(path)  # what the store holds now, not a listing cached before
    return bool(fs.exists(path))


def remove(url: str, *, fs_options: dict[str, Any] | None = None) -> None:
    """Delete a checkpoint folder, its COMMIT.json first: a deletion cut short
    leaves an uncommitted folder, never a committed one with files missing."""
    fs, folder = _open(url, fs_options)
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(f"{folder}/{COMMIT_NAME}")
    with contextlib.suppress(FileNotFoundError):
        fs.rm(folder, recursive=True)
    fs.invalidate_cache(folder)


def list_checkpoints(root_url: str, *, fs_options: dict[str, Any] | None = None) -> list[Row]:
    """Every `step-<N>` folder under root, newest first; other folders are ignored."""
    fs, root = _open(root_url, fs_options)
    fs.invalidate_cache(root)
    if not fs.isdir(root):
        return []
    rows = []
    for info in fs.ls(root, detail=True):
        name = info["name"].rstrip("/")
        step = step_of(name)
        if step is None or info["type"] != "directory":
            continue
        url = _url(fs, name)
        try:
            commit = read_commit(url, fs_options=fs_options)
        except StokerError:
            commit = None
        size = commit.bytes if commit else sum(_files(fs, name).values())
        rows.append(Row(step=step, path=url, committed=commit is not None, bytes=size))
    return sorted(rows, key=lambda r: r.step, reverse=True)


def check_files(
    folder_url: str, entries: list[FileEntry], *, fs_options: dict[str, Any] | None = None
) -> list[Problem]:
    """sha256 of these files of a committed folder against their entries (a
    share of a full verification; see Checkpointer, where ranks split it)."""
    fs, folder = _open(folder_url, fs_options)
    problems = []
    for entry in entries:
        try:
            sha = _sha256(fs, f"{folder}/{entry.path}")
        except FileNotFoundError:
            problems.append(Problem(entry.path, f"{entry.path}: missing"))
            continue
        if sha != entry.sha256:
            problems.append(
                Problem(entry.path, f"{entry.path}: sha256 {sha} != {entry.sha256} in COMMIT.json")
            )
    return problems


def first_good(
    rows: list[Row],
    check: Callable[[Row], list[Problem]],
    warn: Callable[[str], None],
) -> Row | None:
    """The first row (newest first) that `check` passes; one warning per newer
    broken one, naming the step it falls back to."""
    broken: list[tuple[int, Problem]] = []
    for row in rows:
        problems = check(row)
        if not problems:
            for step, problem in broken:
                warn(f"falling back to step-{row.step}: step-{step} is broken: {problem}")
            return row
        broken.append((row.step, problems[0]))
    for step, problem in broken:
        warn(f"no checkpoint verifies: step-{step} is broken: {problem}")
    return None


def newest_verified(
    root_url: str,
    *,
    full: bool,
    warn: Callable[[str], None],
    fs_options: dict[str, Any] | None = None,
) -> tuple[int, str] | None:
    """(step, URL) of the newest checkpoint that verifies; one warning per newer broken one."""
    row = first_good(
        list_checkpoints(root_url, fs_options=fs_options),
        lambda r: verify(r.path, full=full, fs_options=fs_options),
        warn,
    )
    return (row.step, row.path) if row else None
