"""The code snapshot: the exact files a submitted job runs, frozen at submit time.

A job may wait hours in the queue while its author keeps editing; the job must run what was
submitted. `snapshot_code` copies the code into the run folder twice, from one read of each file:

    <run>/code/                  the files; the job's tasks run from here
    <run>/code-<sha12>.tar       the same files as a deterministic tar (for MLflow, for diffing)

The code folder also carries the submitter's compiled bytecode of the Python files, where it
matches them (snapshot_bytecode.py), so the ranks do not each compile the code.

The id (`Snapshot.sha256`) hashes a canonical listing (sorted paths, git-style mode, content
hash), so the same files give the same id whatever their mtimes, owners or listing order.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from stoker.errors import StokerError
from stoker.launcher.launch.snapshot_bytecode import carry_bytecode

DEFAULT_MAX_BYTES = 200 * 2**20
# Skipped in a `--code DIR` snapshot even when no .gitignore says so.
SKIP_DIRS = frozenset({".git", "__pycache__", ".venv", "node_modules"})
SKIP_SUFFIXES = (".pyc",)

# git's own file modes, so the listing reads like `git ls-tree`.
_MODE_FILE = 0o100644
_MODE_EXEC = 0o100755
_MODE_LINK = 0o120000
_CHUNK = 2**20
_FIX_TOO_BIG = (
    "add big files (data, checkpoints, outputs) to .gitignore, point `--code DIR` at the folder "
    "that holds only the code, or pass `--no-snapshot` to run the job from the live folder"
)


@dataclass(frozen=True)
class Snapshot:
    """A finished snapshot; `code_dir` and `tar_path` exist and are complete."""

    sha256: str
    """Hex sha256 of the canonical listing: the snapshot's identity."""
    tar_path: Path
    code_dir: Path
    repo_root: Path | None
    """The git work tree the files came from, or None (a folder outside git)."""
    workdir: Path
    """The folder inside `code_dir` matching the submit folder: run the user's command here."""
    files: int
    total_bytes: int
    git_commit: str | None
    """HEAD's sha, or None (no git, or a repository without commits)."""
    dirty: bool
    """The snapshot differs from HEAD: tracked changes or untracked (not ignored) files."""
    notes: list[str] = field(default_factory=list)
    """What a user should hear about: skipped submodules, odd files."""


@dataclass(frozen=True)
class _Entry:
    rel: str  # posix path relative to the snapshot's base folder
    mode: int  # _MODE_FILE, _MODE_EXEC or _MODE_LINK
    size: int  # bytes at listing time (symlinks: 0)


def snapshot_code(
    source: Path | None,
    run_code_dir: Path,
    *,
    cwd: Path | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> Snapshot | None:
    """Freeze the user's code into `run_code_dir` (which must not exist) and a tar beside it.

    source None: the git repository holding `cwd` (default: the current folder). The snapshot is
    the work tree as the user sees it, not just HEAD: tracked files with their uncommitted edits
    (staged or not), minus files deleted in the work tree, plus untracked files that are not
    ignored, because a new script not yet `git add`ed is expected to be there. Returns None when
    `cwd` is in no git repository (the caller then runs the job from the live submit folder and
    should say so).

    source a folder (`--code DIR`): that folder's files, without .git, __pycache__, *.pyc,
    .venv and node_modules; inside a git repository its ignore rules apply too.

    Symlinks stay symlinks; the executable bit is kept (modes are normalised to 644/755 like
    git's). Submodules and nested repositories are skipped and named in `notes`.
    `Snapshot.workdir` is the folder in `code_dir` that matches `cwd` (`code_dir` itself when
    `cwd` is outside the snapshot); it is created if no snapshotted file lives there.

    Both outputs appear whole or not at all: they are built under temporary names beside the
    destination and renamed last. Raises StokerError when a listed file vanishes or cannot be
    read, or when the files add up to more than `max_bytes`.
    """
    cwd = (cwd or Path.cwd()).resolve()
    notes: list[str] = []
    if source is None:
        repo_root = _repo_root(cwd)
        if repo_root is None:
            return None
        base = repo_root
    else:
        base = source.expanduser().resolve()
        if not base.is_dir():
            raise StokerError(
                f"--code {source}: {base} is not a folder",
                fix="pass the folder that holds the code the job should run",
            )
        repo_root = _repo_root(base)

    if repo_root is None:
        rels = _walk_files(base)
        git_commit, dirty = None, False
    else:
        rels = _git_files(base)
        git_commit, dirty = _git_state(base)
    if source is not None:
        rels = [r for r in rels if not _skipped_by_default(r)]
    rels = _without_data_sets(rels, notes)

    entries = _stat_entries(base, rels, notes)
    _check_size(entries, max_bytes, base)

    run_code_dir = run_code_dir.absolute()
    if run_code_dir.exists() or run_code_dir.is_symlink():
        raise StokerError(
            f"cannot snapshot the code into {run_code_dir}: it already exists",
            fix="snapshot into a fresh run folder",
        )
    token = f"{os.getpid()}-{secrets.token_hex(3)}"
    staging = run_code_dir.with_name(f".{run_code_dir.name}.partial-{token}")
    tar_tmp = run_code_dir.with_name(f".code.tar.partial-{token}")
    tar_path: Path | None = None
    try:
        run_code_dir.parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        digests = _copy_files(base, entries, staging, max_bytes)
        sha = _listing_sha256(entries, digests)
        _write_tar(staging, entries, tar_tmp)
        tar_path = run_code_dir.with_name(f"code-{sha[:12]}.tar")
        tar_tmp.replace(tar_path)
        rel_cwd = _relative_to(cwd, base)
        (staging / rel_cwd).mkdir(parents=True, exist_ok=True)
        staging.rename(run_code_dir)
    except BaseException as exc:
        shutil.rmtree(staging, ignore_errors=True)
        tar_tmp.unlink(missing_ok=True)
        if tar_path is not None:
            tar_path.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # reading errors are StokerErrors already: this is writing
            raise StokerError(
                f"cannot write the code snapshot into {run_code_dir.parent}: {exc}",
                fix="free space there, or set STOKER_HOME to a writable shared file system",
            ) from exc
        raise

    if not entries:
        notes.append(f"the snapshot of {base} holds no files")
    return Snapshot(
        sha256=sha,
        tar_path=tar_path,
        code_dir=run_code_dir,
        repo_root=repo_root,
        workdir=run_code_dir / rel_cwd,
        files=len(entries),
        total_bytes=sum(d[1] for d in digests),
        git_commit=git_commit,
        dirty=dirty,
        notes=notes,
    )


# -- listing -------------------------------------------------------------------------------


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    # LC_ALL=C: English messages to match on; paths come out as raw bytes either way.
    env = {**os.environ, "LC_ALL": "C"}
    return subprocess.run(
        ["git", "-c", "core.quotepath=off", "--no-optional-locks", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        check=False,
    )


def _git_out(args: list[str], cwd: Path) -> bytes:
    proc = _git(args, cwd)
    if proc.returncode != 0:
        raise StokerError(
            f"`git {' '.join(args)}` failed in {cwd}: {os.fsdecode(proc.stderr).strip()}",
            fix="fix the repository (see git's message), or pass `--code DIR` or `--no-snapshot`",
        )
    return proc.stdout


def _repo_root(folder: Path) -> Path | None:
    """The top of the git work tree holding `folder`, or None when there is none."""
    try:
        proc = _git(["rev-parse", "--show-toplevel"], folder)
    except FileNotFoundError:
        # No git on this machine: fine outside a repository, a silent half-snapshot inside one.
        for parent in (folder, *folder.parents):
            if (parent / ".git").exists():
                raise StokerError(
                    f"{folder} is in a git repository ({parent}) but `git` is not on PATH",
                    fix="load or install git, or pass `--code DIR` or `--no-snapshot`",
                ) from None
        return None
    if proc.returncode != 0:
        if b"not a git repository" in proc.stderr:
            return None
        raise StokerError(
            f"git cannot read the repository holding {folder}: {os.fsdecode(proc.stderr).strip()}",
            fix="fix the repository (see git's message), or pass `--code DIR` or `--no-snapshot`",
        )
    return Path(os.fsdecode(proc.stdout.removesuffix(b"\n"))).resolve()


def _split_z(out: bytes) -> list[str]:
    return [os.fsdecode(p) for p in out.split(b"\0") if p]


def _git_files(base: Path) -> list[str]:
    """Files under `base` as the user sees them: tracked minus deleted, plus untracked unignored.

    `git ls-files` run in `base` lists only files below it, relative to it.
    """
    listed = _split_z(
        _git_out(["ls-files", "-z", "--cached", "--others", "--exclude-standard"], base)
    )
    deleted = set(_split_z(_git_out(["ls-files", "-z", "--deleted"], base)))
    # dict.fromkeys: an unmerged file is listed once per conflict stage.
    return [p for p in dict.fromkeys(listed) if p not in deleted]


def _git_state(base: Path) -> tuple[str | None, bool]:
    """(HEAD's sha or None, whether the work tree under `base` differs from it)."""
    head = _git(["rev-parse", "--verify", "--quiet", "HEAD"], base)
    commit = os.fsdecode(head.stdout).strip() if head.returncode == 0 else None
    status = _git_out(["status", "--porcelain", "-z", "--untracked-files=normal", "--", "."], base)
    return commit, bool(status)


def _walk_files(base: Path) -> list[str]:
    """Files and symlinks under a folder outside git (symlinked folders are not followed)."""
    found: list[str] = []
    for root, dirs, files in os.walk(base):
        rel_root = Path(root).relative_to(base)
        keep = []
        for d in dirs:
            if (Path(root) / d).is_symlink():
                found.append((rel_root / d).as_posix())
            elif d not in SKIP_DIRS:
                keep.append(d)
        dirs[:] = keep
        found.extend((rel_root / f).as_posix() for f in files)
    return found


def _skipped_by_default(rel: str) -> bool:
    parts = rel.rstrip("/").split("/")
    return any(p in SKIP_DIRS for p in parts) or rel.endswith(SKIP_SUFFIXES)


def _without_data_sets(rels: list[str], notes: list[str]) -> list[str]:
    """The listing without the data sets in it (a folder holding `manifest.json` and
    `shards/`, as `stoker data synth/pack/encode` write them): a snapshot is code, copied
    into every run folder, and a job reads its data where it is (the config's paths are
    absolute)."""
    from stoker.data.format.shard_format import MANIFEST_NAME, SHARDS_DIR

    holds_shards = set()  # "a/b/" for every listed "a/b/shards/..."
    for rel in rels:
        parts = rel.split("/")
        for i, part in enumerate(parts[1:-1], start=1):
            if part == SHARDS_DIR:
                holds_shards.add("/".join(parts[:i]) + "/")
    roots = sorted(
        folder
        for rel in rels
        if rel.endswith(f"/{MANIFEST_NAME}")
        and (folder := rel.removesuffix(MANIFEST_NAME)) in holds_shards
    )
    if not roots:
        return rels
    for root in roots:
        notes.append(f"left {root} out of the snapshot: a data set, not code (jobs read it there)")
    return [rel for rel in rels if not rel.startswith(tuple(roots))]


def _stat_entries(base: Path, rels: list[str], notes: list[str]) -> list[_Entry]:
    entries = []
    for rel in sorted(rels, key=os.fsencode):
        if rel.endswith("/"):  # git lists an untracked nested repository as "dir/"
            notes.append(f"skipped {rel}: a nested git repository")
            continue
        path = base / rel
        try:
            st = path.lstat()
        except OSError as exc:
            raise _unreadable(path, exc) from exc
        if stat.S_ISLNK(st.st_mode):
            entries.append(_Entry(rel, _MODE_LINK, 0))
        elif stat.S_ISREG(st.st_mode):
            mode = _MODE_EXEC if st.st_mode & 0o100 else _MODE_FILE
            entries.append(_Entry(rel, mode, st.st_size))
        elif stat.S_ISDIR(st.st_mode):
            notes.append(f"skipped {rel}: a git submodule or nested repository (not snapshotted)")
        else:
            notes.append(f"skipped {rel}: not a regular file")
    return entries


def _check_size(entries: list[_Entry], max_bytes: int, base: Path) -> None:
    total = sum(e.size for e in entries)
    if total <= max_bytes:
        return
    biggest = sorted(entries, key=lambda e: e.size, reverse=True)[:5]
    listing = ", ".join(f"{e.rel} ({_human(e.size)})" for e in biggest)
    raise StokerError(
        f"the code snapshot of {base} would hold {_human(total)} in {len(entries)} files, more "
        f"than the limit of {_human(max_bytes)}; the biggest: {listing}",
        fix=_FIX_TOO_BIG,
    )


def _human(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _unreadable(path: Path, exc: OSError) -> StokerError:
    if isinstance(exc, FileNotFoundError):
        return StokerError(
            f"{path} vanished while stoker was snapshotting the code",
            fix="submit again when nothing is writing into the code folder, or add files that "
            "change during a run (outputs, logs) to .gitignore",
        )
    return StokerError(
        f"cannot read {path} for the code snapshot: {exc.strerror or exc}",
        fix="make it readable, or add it to .gitignore (or pass `--code DIR` / `--no-snapshot`)",
    )


# -- copying, hashing, tar ---------------------------------------------------------------------


def _copy_files(
    base: Path, entries: list[_Entry], staging: Path, max_bytes: int
) -> list[tuple[str, int]]:
    """Copy each entry into `staging` from one read; return (content sha256, bytes) per entry.

    Errors reading the user's files become StokerErrors naming the file; errors writing into
    `staging` stay OSErrors.
    """
    digests: list[tuple[str, int]] = []
    total = 0  # bytes actually read, which a file still being written can push past its size
    sources: list[tuple[Path, Path, int]] = []  # the Python files copied: (src, dst, bytes)
    for entry in entries:
        src, dst = base / entry.rel, staging / entry.rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if entry.mode == _MODE_LINK:
            try:
                target = os.readlink(src)
            except OSError as exc:
                raise _unreadable(src, exc) from exc
            os.symlink(target, dst)
            digests.append((hashlib.sha256(os.fsencode(target)).hexdigest(), 0))
            continue
        digest, size = _copy_file(src, dst)
        os.chmod(dst, entry.mode & 0o777)
        digests.append((digest, size))
        if entry.rel.endswith(".py"):
            sources.append((src, dst, size))
        total += size
        if total > max_bytes:  # files grew after the size check: report what was read
            read = [_Entry(e.rel, e.mode, d[1]) for e, d in zip(entries, digests, strict=False)]
            _check_size(read, max_bytes, base)
    # After every listed file: a repository that tracks a .pyc has it copied as a file.
    for src, dst, size in sources:
        carry_bytecode(src, dst, size)
    return digests


def _copy_file(src: Path, dst: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    try:
        fin = src.open("rb")
    except OSError as exc:
        raise _unreadable(src, exc) from exc
    with fin, dst.open("xb") as fout:
        while True:
            try:
                chunk = fin.read(_CHUNK)
            except OSError as exc:
                raise _unreadable(src, exc) from exc
            if not chunk:
                break
            h.update(chunk)
            fout.write(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def _listing_sha256(entries: list[_Entry], digests: list[tuple[str, int]]) -> str:
    """sha256 over `<mode> <content sha256> <path>\\0` lines in byte order of the paths."""
    h = hashlib.sha256()
    for entry, (digest, _) in zip(entries, digests, strict=True):
        h.update(f"{entry.mode:o} {digest} ".encode() + os.fsencode(entry.rel) + b"\0")
    return h.hexdigest()


def _write_tar(staging: Path, entries: list[_Entry], dest: Path) -> None:
    """A byte-reproducible tar of the staged files: sorted, mtime 0, owner 0, no user names."""
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            path = staging / entry.rel
            info = tarfile.TarInfo(entry.rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if entry.mode == _MODE_LINK:
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(path), 0o777
                tar.addfile(info)
                continue
            info.mode, info.size = entry.mode & 0o777, path.stat().st_size
            with path.open("rb") as f:
                tar.addfile(info, f)
    with dest.open("rb") as f:
        os.fsync(f.fileno())


def _relative_to(path: Path, base: Path) -> Path:
    try:
        return path.relative_to(base)
    except ValueError:
        return Path()
