"""A StreamingLoader's checkpointed state: what it holds, and the checks that it may
continue this loader's schedule.

Version 2 holds the schedule's state (stoker/data/stream/schedule.py) and, per data set, its
name, manifest digest and size; plus what else decides the order (seed, shuffle,
buckets). Version 1 (one data set, a stream position) still loads. A state saved on a
data set whose digest has changed since stops the resume, naming it, unless the loader
allows changed data (data.allow_changed_data): positions would then mean other samples.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from stoker.data.stream.schedule import ScheduleState
from stoker.errors import StokerError

log = logging.getLogger("stoker.data")
VERSION = 2


@dataclass(frozen=True)
class LoaderIdentity:
    """What of a loader its state is saved with and checked against (the loader builds
    it: `StreamingLoader.identity()`): its data sets, what decides their order, and how
    it resumes."""

    where: str
    """The loader, for messages: "data of <URLs>"."""
    names: tuple[str, ...]
    """Its data sets' names (data.sources), in the loader's order."""
    digests: tuple[str, ...]
    """Each data set's manifest digest (`Manifest.fingerprint`), by `names`."""
    samples: tuple[int, ...]
    """Each data set's samples per epoch, by `names`."""
    seed: int
    shuffle: bool
    shuffle_shards: int
    buckets: tuple[str, ...]
    """Its buckets' names; none without buckets."""
    batch_size: int
    """The global batch size (of the first bucket)."""
    mixture: bool
    """Built from a list of data sets (names them in messages), not one."""
    allow_changed_data: bool

    @property
    def samples_per_epoch(self) -> int:
        """Samples in one epoch of the first (or only) data set."""
        return self.samples[0]


def save(loader: LoaderIdentity, state: ScheduleState) -> dict[str, Any]:
    first = loader.samples_per_epoch
    epoch, within = divmod(state.positions[0], first)
    return {
        "version": VERSION,
        "schedule": state.as_dict(),
        "sources": [
            {"name": name, "digest": digest, "samples": samples}
            for name, digest, samples in zip(
                loader.names, loader.digests, loader.samples, strict=True
            )
        ],
        "seed": loader.seed,
        "shuffle": loader.shuffle,
        "shuffle_shards": loader.shuffle_shards,
        "buckets": list(loader.buckets),
        # The first data set's place, for people reading the checkpoint (and version 1).
        "epoch": epoch,
        "samples_consumed": within,
        "dataset": loader.digests[0],
        "dataset_samples": first,
    }


def restore(loader: LoaderIdentity, state: dict[str, Any]) -> ScheduleState:
    where = f"loader state for {loader.where}"
    try:
        version = int(state["version"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _not_a_state(where, exc) from exc
    if version > VERSION:
        raise StokerError(
            f"{where}: state version {version} is newer than this stoker reads ({VERSION})",
            fix="upgrade stoker on this machine",
        )
    for key in ("seed", "shuffle", "shuffle_shards"):
        if key in state and state[key] != getattr(loader, key):
            raise StokerError(
                f"{where}: the state was saved with {key}={state[key]!r}, this loader "
                f"has {key}={getattr(loader, key)!r}: the order would differ",
                fix=f"construct the loader with {key}={state[key]!r}",
            )
    if version < 2:
        return _from_version_1(loader, state, where)
    try:
        schedule = ScheduleState.from_dict(state["schedule"])
        saved = {str(s["name"]): (str(s["digest"]), int(s["samples"])) for s in state["sources"]}
        buckets = [str(b) for b in state.get("buckets", [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise _not_a_state(where, exc) from exc
    if sorted(saved) != sorted(loader.names):
        raise StokerError(
            f"{where}: the state was saved with the data sets {sorted(saved)}, this loader "
            f"has {sorted(loader.names)}",
            fix="resume with the data sets (data.sources names) the run started with, or "
            "start the loader afresh",
        )
    ours = list(loader.buckets)
    if buckets != ours:
        raise StokerError(
            f"{where}: the state was saved with buckets {buckets or 'none'}, this loader has "
            f"{ours or 'none'}: the samples waiting in them would be lost or misplaced",
            fix="resume with the data.buckets the run started with (batch sizes may change), "
            "or start the loader afresh",
        )
    order = [list(saved).index(name) for name in loader.names]
    for name, digest in zip(loader.names, loader.digests, strict=True):
        _check_digest(loader, where, name, saved[name][0], digest)
    # The state's sources by the loader's order (a mixture's list may be reordered).
    positions = [schedule.positions[i] for i in order]
    back = {old: new for new, old in enumerate(order)}
    waiting = [[(slot, back[src], pos) for slot, src, pos in q] for q in schedule.waiting]
    if len(waiting) != max(1, len(loader.buckets)) or len(positions) != len(loader.names):
        raise _not_a_state(where, ValueError("schedule does not match its sources and buckets"))
    return ScheduleState(schedule.batches, schedule.slot, positions, waiting)


def _from_version_1(loader: LoaderIdentity, state: dict[str, Any], where: str) -> ScheduleState:
    """One data set and a stream position: the only loader version 1 had."""
    try:
        epoch = int(state["epoch"])
        consumed = int(state["samples_consumed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _not_a_state(where, exc) from exc
    if len(loader.names) != 1 or loader.buckets:
        raise StokerError(
            f"{where}: a version-1 state holds one data set without buckets",
            fix="resume it without data.sources and data.buckets, or start the loader afresh",
        )
    _check_digest(
        loader,
        where,
        loader.names[0],
        str(state.get("dataset")),
        loader.digests[0],
    )
    if not 0 <= consumed < loader.samples_per_epoch or epoch < 0:
        raise StokerError(f"{where}: position epoch={epoch} samples={consumed} is out of range")
    position = epoch * loader.samples_per_epoch + consumed
    return ScheduleState(position // loader.batch_size, position, [position], [[]])


def _check_digest(loader: LoaderIdentity, where: str, name: str, saved: str, now: str) -> None:
    if saved == now:
        return
    named = f"data set {name!r}" if loader.mixture else "the data set"
    message = (
        f"{where}: {named} changed since the state was saved (manifest digest {saved} "
        f"then, {now} now): its positions mean other samples"
    )
    if loader.allow_changed_data:
        log.warning("stoker.data: %s; resuming anyway (data.allow_changed_data)", message)
        return
    raise StokerError(
        message,
        fix="resume on the data set the run started with, or set "
        "data.allow_changed_data=true to continue from the same positions anyway",
    )


def _not_a_state(where: str, exc: BaseException) -> StokerError:
    return StokerError(
        f"{where}: not a StreamingLoader state ({exc!r} missing or bad)",
        fix="pass what StreamingLoader.state_dict() returned",
    )
