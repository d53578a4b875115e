"""The compiled bytecode a code snapshot carries, so that a job's ranks do not each compile
its code.

A job's tasks import its modules from the snapshot (`<run>/code/`), a fresh copy with no
`__pycache__`: every rank of every job would compile every module it imports from there
(measured on the 2-core VM: 0.7 CPU-s of a rank's start when it imports stoker's runtime
from a snapshot of stoker's own repository), and on a shared file system the ranks of a
big job race to write the same .pyc files. So the submitter's bytecode travels with the
code: for each snapshotted `x.py`, its `__pycache__/x.<tag>.pyc` of the submitting
interpreter is copied beside the copy, and the copy keeps the source's time stamp, which
Python checks against the .pyc's header on import.

Bytecode is only an optimisation: a .pyc that does not match the file copied (the source
was edited after it was compiled), an unchecked hash-based .pyc (Python would trust it
blindly) or one that cannot be read is left out, and Python compiles that module as it
always did. A task running another Python version ignores the .pyc (its name carries the
interpreter's tag). The snapshot's id and tar hold the sources only.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

# PEP 552's header: magic (4 bytes), flags (4), then the source's mtime and size (4 + 4,
# little endian, modulo 2**32) for a timestamp .pyc, or the source's hash (8) for a
# hash-based one.
_HEADER_BYTES = 16
_FLAG_HASH_BASED = 0b01
_FLAG_CHECK_SOURCE = 0b10


def carry_bytecode(src: Path, dst: Path, copied_bytes: int) -> bool:
    """Copy `src`'s bytecode (this interpreter's) beside its copy `dst`, when it is the
    bytecode of the `copied_bytes` bytes just copied; give `dst` the source's time stamp.
    Returns whether bytecode was carried. Errors writing into the snapshot are raised."""
    try:
        cached = Path(importlib.util.cache_from_source(os.fspath(src)))
        with cached.open("rb") as f:
            header = f.read(_HEADER_BYTES)
        source = src.stat()
    except (OSError, NotImplementedError, ValueError):
        return False  # no bytecode, or none this interpreter can name
    if not _matches(header, source, copied_bytes):
        return False
    dst_cached = dst.parent / "__pycache__" / cached.name
    if dst_cached.exists():  # a .pyc the repository tracks was copied as one of its files
        return False
    dst_cached.parent.mkdir(exist_ok=True)
    try:
        shutil.copyfile(cached, dst_cached)
    except FileNotFoundError:  # removed since it was read: the module compiles as before
        dst_cached.unlink(missing_ok=True)
        return False
    os.utime(dst, ns=(source.st_atime_ns, source.st_mtime_ns))
    return True


def _matches(header: bytes, source: os.stat_result, copied_bytes: int) -> bool:
    """Whether a .pyc with this header is valid for the copied source, as Python's
    import checks it (importlib._bootstrap_external._validate_timestamp_pyc)."""
    if len(header) < _HEADER_BYTES or header[:4] != importlib.util.MAGIC_NUMBER:
        return False
    flags = int.from_bytes(header[4:8], "little")
    if flags & _FLAG_HASH_BASED:
        # A checked hash-based .pyc is verified against the source by the importer; an
        # unchecked one would be used even if the source differs.
        return bool(flags & _FLAG_CHECK_SOURCE)
    mtime = int.from_bytes(header[8:12], "little")
    size = int.from_bytes(header[12:16], "little")
    return (
        source.st_size == copied_bytes
        and size == copied_bytes & 0xFFFFFFFF
        and mtime == int(source.st_mtime) & 0xFFFFFFFF
    )
