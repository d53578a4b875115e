"""What `stoker data pack` will write, decided once from one listing of SRC.

Files sharing a path without extension form one sample: `clips/a.mp4`,
`clips/a.flac`, `clips/a.json` and `clips/a.txt` become sample `clips/a`. Its key
is that path with every '.' replaced by '_' (WebDataset splits member names at
the first dot; `check_key` allows none). Every file of SRC is either packed or
reported with a reason: a file of any extension but the sidecars (.json, .txt) may
be media, and the shard writers' probe decides (FFmpeg reads more than any list of
extensions); sidecars without a media file beside them, array files, hidden files
and files without an extension are reported here.

The plan (DST/pack-plan.json) holds the listing, the options and the samples of
every shard: samples sorted by key, filled greedily into shards of about
`--target-shard-mb` by their source size. The media are not read here: shard
writers probe and decode them in parallel, and report what they cannot read. A
re-run compares its own listing and options with the saved plan, so it resumes
exactly the shards the first run would have written, or says what changed.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stoker.data.format.shard_format import AUDIO_EXTS, VIDEO_EXTS, check_key, dump, join
from stoker.data.write.location import open_location
from stoker.errors import StokerError

PLAN_NAME = "pack-plan.json"
PLAN_FORMAT: Final = "stoker-pack-plan"
PLAN_VERSION = 2
"""2: every file is listed and reported or packed; options gained audio_stream."""
SIDECAR_EXTS = ("json", "txt")
# Array members a sample may hold (stoker.data.media.decode.ARRAY_EXTS); the packer does not
# write them: shards holding them are written otherwise.
ARRAY_EXTS = ("npy", "safetensors")

# Why the grouping leaves a file out (SkippedInput.kind); the writers add the probe's
# kinds (stoker.data.media.probe: "not media", "truncated", ...).
SIDECAR_WITHOUT_MEDIA = "sidecar without media"
NAME_CONFLICT = "name conflict"
BAD_NAME = "bad name"
ARRAY_FILE = "array file"
HIDDEN_FILE = "hidden file"
NO_EXTENSION = "no extension"
# Per tar member: a 512-byte header (PAX adds one more for long names) and padding.
_TAR_OVERHEAD = 1024


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PackOptions(_Model):
    """The options that decide the shards' content: a re-run must repeat them."""

    clip_seconds: float | None = None
    """Cut samples into clips this long and re-encode them; None copies files as they are."""
    target_shard_mb: float = 256
    """Shards are filled up to about this size (MB of source bytes)."""
    audio_stream: int = Field(default=0, ge=0)
    """Which audio track of a video file gives the sample's audio (counted from 0 among
    the file's audio streams); an audio file beside the video wins over any track."""


class InputFile(_Model):
    """One file of the listing: what a re-run compares to see that SRC is unchanged."""

    size: int = Field(ge=0)
    modified: str = ""
    """The filesystem's modification stamp, as text; empty where it has none."""


class SkippedInput(_Model):
    """An input left out, with a reason a person can act on."""

    path: str
    """Relative to SRC."""
    reason: str
    kind: str = "other"
    """The reason in a few words, for counts: "not media", "truncated", "sidecar without
    media", ... (the constants here and in stoker.data.media.probe)."""


class PlannedMember(_Model):
    path: str
    """Relative to SRC."""
    size: int = Field(ge=0)


class PlannedSample(_Model):
    key: str
    members: dict[str, PlannedMember]
    """By extension, lower case: {"mp4": ..., "flac": ..., "json": ...}."""

    @property
    def estimated_bytes(self) -> int:
        return sum(m.size + _TAR_OVERHEAD for m in self.members.values())


class PackPlan(_Model):
    format: Literal["stoker-pack-plan"] = PLAN_FORMAT
    version: int = PLAN_VERSION
    src: str
    """SRC as given on the first run (for people; a re-run reads its own SRC)."""
    options: PackOptions
    inputs: dict[str, InputFile]
    """Every file under SRC, by path relative to SRC."""
    skipped: list[SkippedInput]
    """Inputs left out by the grouping (the writers report unreadable media)."""
    shards: list[list[PlannedSample]]
    """Shard number -> its samples, in key order."""


@dataclass(frozen=True)
class Listing:
    """SRC listed once: the filesystem, the root path on it, and every file under it."""

    fs: Any
    root: str
    url: str
    """The root with its protocol, for worker processes to open it again."""
    files: dict[str, InputFile]


def list_inputs(src: str, *, exclude: tuple[Any, str] | None = None) -> Listing:
    """List SRC once. `exclude` is (fs, root) of a tree to leave out (DST inside SRC)."""
    fs, root, url = open_location(src)
    if not fs.exists(root):
        raise StokerError(
            f"SRC {src!r} does not exist",
            fix="give the folder (or fsspec URL, e.g. s3://bucket/prefix) holding the media",
        )
    if not fs.isdir(root):
        raise StokerError(
            f"SRC {src!r} is a file, not a folder", fix="give the folder that holds the media"
        )
    skip_prefix = None
    if exclude is not None and type(exclude[0]) is type(fs):
        skip_prefix = exclude[1].rstrip("/") + "/"
    files: dict[str, InputFile] = {}
    for path, info in sorted(fs.find(root, detail=True).items()):
        if info.get("type", "file") != "file" or (skip_prefix and path.startswith(skip_prefix)):
            continue
        rel = path[len(root) :].lstrip("/")
        files[rel] = InputFile(size=int(info.get("size") or 0), modified=_modified(info))
    if not any(_left_out(rel) is None and _ext(rel) not in SIDECAR_EXTS for rel in files):
        raise StokerError(
            f"SRC {src!r} holds no media files",
            fix=f"pack a folder with video ({', '.join(VIDEO_EXTS)}, ...) or audio "
            f"({', '.join(AUDIO_EXTS)}, ...) files, sub-folders included",
        )
    return Listing(fs=fs, root=root, url=url, files=files)


def _modified(info: dict[str, Any]) -> str:
    # Each filesystem names it differently: local mtime, S3 LastModified, GCS updated.
    for name in ("mtime", "LastModified", "updated", "created"):
        if info.get(name) is not None:
            return str(info[name])
    return ""


def _ext(rel: str) -> str:
    """Lower-case extension of a path; "" when its file name has no dot."""
    name = posixpath.basename(rel)
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def _stem(rel: str) -> str:
    """The path without its extension (a dot in a folder name is no extension)."""
    return rel[: -len(_ext(rel)) - 1] if _ext(rel) else rel


def _left_out(rel: str) -> SkippedInput | None:
    """A file that is never a sample's member, with why; None for the others."""
    if any(part.startswith(".") for part in rel.split("/")):
        reason = "hidden file (its name or a folder's starts with '.')"
        return SkippedInput(path=rel, reason=reason, kind=HIDDEN_FILE)
    ext = _ext(rel)
    if not ext:
        return SkippedInput(
            path=rel,
            reason="no extension: shard members are named by it; add the format's (.mp4, ...)",
            kind=NO_EXTENSION,
        )
    if ext.rsplit(".", 1)[-1] in ARRAY_EXTS:
        return SkippedInput(
            path=rel,
            reason=f".{ext} arrays are not packed (data pack writes media, .json and .txt)",
            kind=ARRAY_FILE,
        )
    return None


def key_for(stem: str) -> str:
    """The sample key of a path without extension: dots become '_' (`a.b/c.d` -> `a_b/c_d`)."""
    return "/".join(part.replace(".", "_") for part in stem.split("/"))


def group_samples(files: dict[str, InputFile]) -> tuple[list[PlannedSample], list[SkippedInput]]:
    """Samples by key, and the files left out with why. A sample's members are its
    sidecars and its other files, which the writers probe: video, audio, or reported."""
    skipped: list[SkippedInput] = []
    groups: dict[str, list[str]] = {}
    for rel in sorted(files):
        left_out = _left_out(rel)
        if left_out is not None:
            skipped.append(left_out)
        else:
            groups.setdefault(_stem(rel), []).append(rel)
    by_key: dict[str, list[tuple[str, dict[str, str]]]] = {}
    for stem, rels in groups.items():
        media = [r for r in rels if _ext(r) not in SIDECAR_EXTS]
        if not media:
            skipped += [
                SkippedInput(
                    path=r, reason="no media file shares its name", kind=SIDECAR_WITHOUT_MEDIA
                )
                for r in rels
            ]
            continue
        problem = _group_problem(stem, rels)
        if problem:
            reason, kind = problem
            skipped += [SkippedInput(path=r, reason=reason, kind=kind) for r in media]
            continue
        by_key.setdefault(key_for(stem), []).append((stem, {_ext(r): r for r in rels}))
    samples = []
    for key, entries in sorted(by_key.items()):
        if len(entries) > 1:
            names = ", ".join(repr(stem) for stem, _ in entries)
            reason = (
                f"{names} all become sample key {key!r} ('.' turns into '_'); rename all but one"
            )
            for _, members in entries:
                skipped += [
                    SkippedInput(path=r, reason=reason, kind=NAME_CONFLICT)
                    for e, r in members.items()
                    if e not in SIDECAR_EXTS
                ]
            continue
        members = entries[0][1]
        samples.append(
            PlannedSample(
                key=key,
                members={e: PlannedMember(path=r, size=files[r].size) for e, r in members.items()},
            )
        )
    return samples, sorted(skipped, key=lambda s: s.path)


def _group_problem(stem: str, rels: list[str]) -> tuple[str, str] | None:
    """(reason, kind) when the files named `stem` cannot form a sample. Two videos or two
    audio files of one name are found by the writers' probe (a file's name does not
    say what it holds)."""
    exts = [_ext(r) for r in rels]
    if len(set(exts)) < len(exts):
        return "two files differ only in the case of their extension; rename one", NAME_CONFLICT
    if not posixpath.basename(stem):
        return "no file name before the extension", BAD_NAME
    try:
        check_key(key_for(stem))
    except StokerError as exc:
        return f"cannot be a sample key: {exc.message}", BAD_NAME
    return None


def assign_shards(samples: list[PlannedSample], target_bytes: int) -> list[list[PlannedSample]]:
    """Samples in key order, filled greedily into shards of at most `target_bytes` each
    (a sample larger than that gets a shard of its own)."""
    shards: list[list[PlannedSample]] = []
    current: list[PlannedSample] = []
    size = 0
    for sample in sorted(samples, key=lambda s: s.key):
        if current and size + sample.estimated_bytes > target_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(sample)
        size += sample.estimated_bytes
    if current:
        shards.append(current)
    return shards


def make_plan(src: str, listing: Listing, options: PackOptions) -> PackPlan:
    samples, skipped = group_samples(listing.files)
    if not samples:
        reasons = "; ".join(f"{s.path}: {s.reason}" for s in skipped[:3])
        raise StokerError(
            f"SRC {src!r}: no media file forms a sample ({reasons})",
            fix="rename the files named above",
        )
    target = max(1, int(options.target_shard_mb * 1_000_000))
    return PackPlan(
        src=src,
        options=options,
        inputs=listing.files,
        skipped=skipped,
        shards=assign_shards(samples, target),
    )


def plan_bytes(plan: PackPlan) -> bytes:
    return dump(plan)


def load_plan(fs: Any, dst_root: str) -> PackPlan | None:
    """The plan a previous run saved under DST, or None."""
    path = join(dst_root, PLAN_NAME)
    if not fs.exists(path):
        return None
    try:
        plan = PackPlan.model_validate_json(fs.cat_file(path))
    except ValidationError as exc:
        raise StokerError(
            f"{path}: not a plan this stoker reads ({exc.errors()[0]['msg']})",
            fix="add --restart to discard it and the shards under DST, and pack again",
        ) from exc
    if plan.version != PLAN_VERSION:
        raise StokerError(
            f"{path}: planned by another stoker (plan version {plan.version}, this one "
            f"plans version {PLAN_VERSION}: it lists and reports every file of SRC)",
            fix="add --restart to discard it and the shards under DST, and pack again",
        )
    return plan


def _option_flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _show(value: Any) -> str:
    return "none" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


def check_resumable(
    plan: PackPlan, options: PackOptions, files: dict[str, InputFile], *, where: str
) -> None:
    """Raise a StokerError naming what differs between the plan saved in DST `where`
    and this run."""
    changed = [
        f"{_option_flag(name)} {_show(getattr(plan.options, name))} then, "
        f"{_show(getattr(options, name))} now"
        for name in PackOptions.model_fields
        if getattr(plan.options, name) != getattr(options, name)
    ]
    if changed:
        same = " ".join(
            f"{_option_flag(n)} {_show(getattr(plan.options, n))}"
            for n in PackOptions.model_fields
            if getattr(plan.options, n) is not None
        )
        raise StokerError(
            f"{where} was packed with other options ({'; '.join(changed)}; see its {PLAN_NAME})",
            fix=f"re-run with the same options to resume ({same}), or add --restart "
            "to discard the shards written so far and pack with the new ones",
        )
    if plan.inputs != files:
        added = sorted(set(files) - set(plan.inputs))
        removed = sorted(set(plan.inputs) - set(files))
        modified = sorted(r for r in set(files) & set(plan.inputs) if files[r] != plan.inputs[r])
        parts = [
            f"{len(names)} {what} (e.g. {names[0]})"
            for what, names in (("added", added), ("removed", removed), ("modified", modified))
            if names
        ]
        raise StokerError(
            f"SRC changed since {where} was planned from it: {', '.join(parts)}",
            fix="restore SRC to resume, or add --restart to discard the shards written so "
            "far and pack SRC as it is now",
        )
