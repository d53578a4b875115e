"""`stoker doctor`'s storage checks: a folder writable here, and on a file system the
compute nodes see too (from /proc/mounts); the run folder's check.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from stoker.launcher.doctor.check import Finding

# Mount types that several machines see; everything in LOCAL_FILESYSTEMS is this node's own.
SHARED_FILESYSTEMS = frozenset(
    [
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "beegfs",
        "ceph",
        "cephfs",
        "fuse.ceph",
        "glusterfs",
        "fuse.glusterfs",
        "wekafs",
        "panfs",
        "cifs",
        "smb3",
        "fuse.sshfs",
        "pvfs2",
        "orangefs",
        "fuse.juicefs",
    ]
)
LOCAL_FILESYSTEMS = frozenset(
    [
        "ext2",
        "ext3",
        "ext4",
        "xfs",
        "btrfs",
        "zfs",
        "f2fs",
        "tmpfs",
        "ramfs",
        "overlay",
        "vfat",
        "squashfs",
    ]
)


def mount_of(path: Path, mounts_text: str) -> tuple[str, str] | None:
    """(mount point, fs type) of the mount holding absolute `path`, from /proc/mounts text."""
    best: tuple[str, str] | None = None
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        # /proc/mounts escapes spaces and tabs in mount points as octal (\040, \011).
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = str(path) == point or str(path).startswith(point.rstrip("/") + "/")
        # A later mount on the same point hides the earlier one: >= keeps the last.
        if inside and (best is None or len(point) >= len(best[0])):
            best = (point, fields[2])
    return best


def nearest_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def sharing_finding(check: str, path: Path, what: str, fix: str) -> Finding:
    """ok, or warn (with `fix`) when `path` is on a file system local to this node."""
    try:
        mounts_text = Path("/proc/mounts").read_text()
    except OSError:
        return Finding(check, "ok", f"{what}; file system type unknown (no /proc/mounts)")
    mount = mount_of(nearest_existing(path).resolve(), mounts_text)
    fstype = mount[1] if mount else "unknown"
    if fstype in LOCAL_FILESYSTEMS:
        return Finding(
            check,
            "warn",
            f"{what}, but on {fstype} ({mount[0] if mount else '?'}), local to this node: "
            "compute nodes must see this path",
            fix,
        )
    shared = "shared" if fstype in SHARED_FILESYSTEMS else "make sure compute nodes see it"
    return Finding(check, "ok", f"{what} ({fstype}: {shared})")


def writable_folder(folder: Path) -> str | None:
    """None when a file can be created in `folder` (or the nearest existing parent, which
    a writer would create it under); else why not. Writes and deletes one temp file."""
    target = nearest_existing(folder)
    if not target.is_dir():
        return f"{target} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".stoker-doctor-", dir=target)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"cannot write in {target}: {exc.strerror}"
    return None


def check_run_folder() -> list[Finding]:
    from stoker.launcher.jobs.rundir import runs_root

    root = runs_root()
    fix = "set STOKER_HOME to a writable folder that compute nodes also see"
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return [Finding("run folder", "fail", f"cannot create {root}: {exc.strerror}", fix)]
    problem = writable_folder(root)
    if problem:
        return [Finding("run folder", "fail", problem, fix)]
    shared_fix = (
        "set STOKER_HOME to a folder on a shared file system (nfs, lustre, gpfs, ...); "
        "ignore this on a one-machine cluster"
    )
    return [sharing_finding("run folder", root, f"{root} writable", shared_fix)]
