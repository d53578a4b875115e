"""Model checks that passed, remembered, so that an unchanged model is not checked again.

The model check (stoker/launcher/launch/model_fit.py) starts a child process that
imports torch, builds the model on the meta device and runs its forward: about 3 CPU-s
on a login node before every `stoker run`, `submit`, `sweep` and `check`. Its verdict
depends only on the settings it reads and the code it imports, so a pass is kept and
reused while both are the same:

- the key: the settings the check reads (`model.*`; `data.*` but where its data sets
  are and how the loader reads them (LOADER_ONLY), which change no shape;
  `train.context_parallel`, `train.context_parallel_ulysses` and `train.seed`), the
  child's environment (`job.env`, `PYTHONPATH`) and the Python that runs it;
- the files: every module file the check imported (the model's package, stoker, torch
  and the rest) and every other file it opened (one a factory reads as it builds), each
  with its size and modification time in nanoseconds as the check saw them. Any of them
  changed or gone, and the model is checked again;
- the folder it ran in, which Python searches first: a pass that imported a file from
  there holds only there, and a folder holding a module of a name the check imported
  (which would be imported instead) gets a check of its own.

A refusal is never kept: a broken model is checked every time, so its message is always
the check's own. Latent data sets are not kept either (their shapes come from the
manifests at data.url). The notes of a passed check (a forward left to the ranks) are
kept with it and said again.

Where: `$STOKER_MODEL_CHECK_CACHE`, else `$STOKER_HOME/cache/model-checks`; the
MAX_ENTRIES most recently used are kept. An empty `STOKER_MODEL_CHECK_CACHE` turns the
cache off. A cache that cannot be read or written is a miss, never an error.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from stoker.config import ResolvedConfig
from stoker.home import stoker_home

CACHE_ENV = "STOKER_MODEL_CHECK_CACHE"
# The loader's own settings: how it reads and orders the samples, never their shapes,
# which is all the check takes from `data.*`.
LOADER_ONLY = (
    "num_workers",
    "start_method",
    "decode_threads",
    "prefetch_mb",
    "shuffle_shards",
    "clip_offset",
    "allow_changed_data",
)
MAX_ENTRIES = 64
FileStamps = dict[str, list[int]]
"""A file the check imported or read -> [size, modification time in ns]."""
ImportedFiles = dict[str, Any]
"""What the check's child wrote (stoker/runtime/preflight.py, `--imported`): "files"
(FileStamps), "top" (the top-level names of the modules imported), "cwd" (where it ran)."""


def cache_folder() -> Path | None:
    """Where passed checks are kept; None when the cache is off."""
    value = os.environ.get(CACHE_ENV)
    if value is None:
        return stoker_home() / "cache" / "model-checks"
    return Path(value).expanduser() if value else None


def check_key(configs: Sequence[ResolvedConfig], python: str, env: Mapping[str, str]) -> str | None:
    """The key of a check of `configs` by `python` with `env`; None when the check may
    not be kept (latent data)."""
    checked = []
    for resolved in configs:
        cfg = resolved.config
        if "latent" in cfg.data.modalities:
            return None
        data = cfg.data.model_dump(mode="json")
        for where in ("url", "eval_url", *LOADER_ONLY):
            data.pop(where, None)
        for source in data.get("sources", []):
            source.pop("url", None)
        train = cfg.train
        checked.append(
            {
                "model": cfg.model.model_dump(mode="json"),
                "data": data,
                "train": [train.context_parallel, train.context_parallel_ulysses, train.seed],
            }
        )
    job_env = dict(configs[0].config.job.env)
    document = {
        "configs": checked,
        "python": python,
        "env": {"job.env": job_env, "PYTHONPATH": env.get("PYTHONPATH", "")},
    }
    text = json.dumps(document, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def passed_before(key: str, cwd: Path) -> list[str] | None:
    """The notes of a check with this key that passed with the same files, run in `cwd`;
    None when there is none, a file it imported or read has changed, or `cwd` would
    change what it imports."""
    folder = cache_folder()
    if folder is None:
        return None
    path = folder / f"{key}.json.gz"
    try:
        entry: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
        files: FileStamps = entry["files"]
        notes: list[str] = entry["notes"]
        ran_in = Path(entry["cwd"])
        top: list[str] = entry["top"]
    except (OSError, ValueError, EOFError, KeyError, TypeError):
        return None
    cwd = cwd.resolve()
    # What it imported or read from the folder it ran in: a pass there holds only there.
    local = {Path(name).relative_to(ran_in).parts[0].split(".", 1)[0]
             for name in files if Path(name).is_relative_to(ran_in)}  # fmt: skip
    if local and cwd != ran_in:
        return None
    if shadowing(cwd, top) - local or not files or not unchanged(files):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used: the last to be dropped
    return notes


def unchanged(files: FileStamps) -> bool:
    for name, (size, mtime_ns) in files.items():
        try:
            stat = os.stat(name)
        except OSError:
            return False
        if stat.st_size != size or stat.st_mtime_ns != mtime_ns:
            return False
    return True


def shadowing(folder: Path, top: list[str]) -> set[str]:
    """The names of `top` (top-level modules) that `folder` holds a module or package of,
    which Python would import from it; all of them when it cannot be listed."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return set(top)
    return {entry.split(".", 1)[0] for entry in entries} & set(top)


def remember(key: str, imported: ImportedFiles, notes: list[str]) -> None:
    """Keep a passed check (written whole or not at all), and drop the least recently
    used beyond MAX_ENTRIES."""
    folder = cache_folder()
    if folder is None or not imported.get("files"):
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temp = folder / f".{key}.{os.getpid()}.tmp"
        temp.write_bytes(gzip.compress(json.dumps({**imported, "notes": notes}).encode()))
        temp.replace(folder / f"{key}.json.gz")
        entries = sorted(folder.glob("*.json.gz"), key=_used_at, reverse=True)
        for old in entries[MAX_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass


def _used_at(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
