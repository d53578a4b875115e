"""Where a committed checkpoint came from: its step, the digest of its commit record and
the MLflow run that saved it. What a registered model version's lineage starts from
(stoker/tracking/model_registry.py).

The digest is the sha256 of the COMMIT.json bytes. COMMIT.json lists every file of the
folder with its sha256, so this one digest pins the whole checkpoint, and anyone can
check it with `sha256sum step-<N>/COMMIT.json` without reading the shards.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from dataclasses import dataclass, field
from typing import Any

from stoker.checkpoint import commit as ck
from stoker.checkpoint.storage import storage_reader
from stoker.errors import StokerError

TRAIN_KEY = "train"
"""The DCP key of the JSON train state (stoker/checkpoint/train_state.py)."""


@dataclass(frozen=True)
class CheckpointOrigin:
    folder: str
    """The `step-<N>` folder URL."""
    step: int
    commit_sha256: str
    """sha256 of the folder's COMMIT.json bytes."""
    mlflow_run_id: str | None
    """The run the train state names; None for a checkpoint saved without tracking, or
    by a loop that saved no `train` entry."""
    facts: dict[str, Any] = field(default_factory=dict)
    """COMMIT.json's extra: what the run that saved it was (SavedDescription.facts)."""


def commit_sha256(folder_url: str, *, fs_options: dict[str, Any] | None = None) -> str:
    """sha256 (hex) of the folder's COMMIT.json; StokerError when it has none."""
    return hashlib.sha256(_commit_bytes(folder_url, fs_options)).hexdigest()


def _commit_bytes(folder_url: str, fs_options: dict[str, Any] | None) -> bytes:
    fs, folder = ck._open(folder_url, fs_options)
    target = f"{folder}/{ck.COMMIT_NAME}"
    fs.invalidate_cache(target)  # as read_commit: a cached listing may predate the commit
    try:
        return bytes(fs.cat_file(target))
    except FileNotFoundError:
        raise StokerError(
            f"checkpoint {folder_url!r} is not committed: no {ck.COMMIT_NAME}",
            fix="name a committed step-<N> folder (`stoker ckpt ls` on the root lists them)",
        ) from None


def saved_run_id(folder_url: str, *, fs_options: dict[str, Any] | None = None) -> str | None:
    """The `mlflow_run_id` of the checkpoint's train state, read alone (a few bytes:
    DCP loads only the keys asked for); None when the checkpoint has no train state
    or it names no run."""
    from torch.distributed.checkpoint.state_dict_loader import load

    reader = storage_reader(folder_url, fs_options)
    if TRAIN_KEY not in reader.read_metadata().state_dict_metadata:
        return None
    state: dict[str, Any] = {TRAIN_KEY: ""}
    with warnings.catch_warnings():  # one process is intended: no process group
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load(state, storage_reader=reader, no_dist=True)
    try:
        run_id = json.loads(state[TRAIN_KEY]).get("mlflow_run_id")
    except (TypeError, ValueError, AttributeError):
        return None  # an own loop's `train` entry that is not stoker's JSON
    return str(run_id) if run_id else None


def read_origin(folder_url: str, *, fs_options: dict[str, Any] | None = None) -> CheckpointOrigin:
    """The origin of the committed `step-<N>` folder at `folder_url`."""
    raw = _commit_bytes(folder_url, fs_options)  # read once: the digest is of what was parsed
    commit = ck._parse(raw, f"{folder_url.rstrip('/')}/{ck.COMMIT_NAME}")
    return CheckpointOrigin(
        folder=folder_url,
        step=commit.step,
        commit_sha256=hashlib.sha256(raw).hexdigest(),
        mlflow_run_id=saved_run_id(folder_url, fs_options=fs_options),
        facts=dict(commit.extra),
    )


@dataclass(frozen=True)
class SavedDescription:
    """What a committed checkpoint says of itself (stoker/checkpoint/commit.py's
    CONFIG_NAME and COMMIT.json's extra): enough to use it with no run folder."""

    folder: str
    """The `step-<N>` folder it was read from (a root's newest that verifies)."""
    config_text: str | None
    """The frozen experiment of the run that saved it; None for a checkpoint written
    before stoker kept it there, or by a Checkpointer given none."""
    facts: dict[str, Any]
    """COMMIT.json's extra: model_arch, data_shapes, tracking_uri (passwords hidden)."""
    measured_text: str | None = None
    """What the run's steps measured up to the commit (ck.MEASURED_NAME); None when the
    commit carries none."""


def saved_description(url: str, *, fs_options: dict[str, Any] | None = None) -> SavedDescription:
    """The description a checkpoint carries: `url` is a committed step-<N> folder, or a
    checkpoint root (its newest committed step that verifies, by sizes)."""
    folder = url
    if ck.step_of(url) is None:
        found = ck.newest_verified(url, full=False, warn=lambda _: None, fs_options=fs_options)
        if found is None:
            raise StokerError(
                f"no committed checkpoint under {url!r} verifies",
                fix=f"see `stoker ckpt verify {url}`; name a committed step-<N> folder",
            )
        folder = found[1]
    commit = ck.read_commit(folder, fs_options=fs_options)
    if commit is None:
        raise StokerError(
            f"checkpoint {folder!r} is not committed: no {ck.COMMIT_NAME}",
            fix="name a committed step-<N> folder (`stoker ckpt ls` on the root lists them)",
        )
    fs, path = ck._open(folder, fs_options)
    carried = {f.path for f in commit.files}

    def text_of(name: str) -> str | None:
        return bytes(fs.cat_file(f"{path}/{name}")).decode() if name in carried else None

    return SavedDescription(
        folder=folder,
        config_text=text_of(ck.CONFIG_NAME),
        facts=dict(commit.extra),
        measured_text=text_of(ck.MEASURED_NAME),
    )
