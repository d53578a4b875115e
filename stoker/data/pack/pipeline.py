"""`stoker data pack`: a folder (or fsspec prefix) of media in, a data set out.

    list SRC once -> plan (DST/pack-plan.json)              `prepare_pack`
      -> write the missing shards in parallel (local processes here; a SLURM
         array through stoker.launcher.launch.data_array and stoker.data.jobs.pack_task)
      -> manifest.json from every index                      `finalize_pack`

A shard is finished when its index is on storage (the writer puts it after the
tar), so a re-run with the same SRC and options writes only the shards that are
missing and leaves the others untouched. The manifest is written last, and only
when every shard is there: a data set with a manifest is complete. It is a function
of the shards alone, so whichever process finishes last may write it (two that race
write the same bytes).

Local workers are 'forkserver' (or 'spawn') processes, never forked copies of this
one: fsspec's async filesystems (s3fs, gcsfs) are not fork-safe. A
memory:// filesystem exists only in this process, so it is packed here.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stoker.data.format.shard_format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    Manifest,
    ShardIndex,
    index_name_for,
    join,
    shard_file_name,
)
from stoker.data.pack.plan import (
    PLAN_NAME,
    Listing,
    PackOptions,
    PackPlan,
    SkippedInput,
    check_resumable,
    list_inputs,
    load_plan,
    make_plan,
    plan_bytes,
)
from stoker.data.pack.shard import (
    SKIPPED_DIR,
    ShardTask,
    skipped_path,
    write_planned_shard,
)
from stoker.data.write.location import open_location
from stoker.data.write.shard_pool import (
    PackProgress,
    SilentProgress,
    refuse_failures,
    run_shard_writers,
)
from stoker.data.write.shard_set import finished_shards, write_manifest
from stoker.data.write.shard_writer import write_json_atomic
from stoker.errors import StokerError
from stoker.plural import plural
from stoker.process.cores import usable_cores

CREATED_BY = "stoker data pack"
WORK_DIR = "pack-work"
"""Under DST: the work files of `data pack --slurm` jobs (each array task's shards)."""


@dataclass(frozen=True)
class PackRequest:
    src: str
    dst: str
    options: PackOptions = field(default_factory=PackOptions)
    workers: int | None = None
    """Local processes (`run_pack`); None: the CPU count."""
    restart: bool = False
    """Discard a previous pack under DST (plan, shards, manifest) instead of resuming."""


@dataclass
class PreparedPack:
    """A pack planned under DST: what is finished and what is left to write."""

    plan: PackPlan
    src_url: str
    """SRC with its protocol, absolute: what a writer elsewhere opens."""
    dst_fs: Any
    dst_root: str
    dst_url: str
    finished: dict[int, ShardIndex]
    pending: list[int]
    in_process: bool
    """SRC or DST is memory://: only this process can write the shards."""

    def task(self, number: int) -> ShardTask:
        """The writer's task of shard `number`."""
        return shard_task(self.plan, self.src_url, self.dst_url, number)


@dataclass
class PackReport:
    samples: int
    shards: int
    skipped: list[dict[str, str]]
    """{"path": full SRC path, "reason": ..., "kind": ...}, sorted by path; `kind` is the
    reason in a few words ("not media", "truncated", "sidecar without media", ...)."""
    planned: int
    """Shards in the plan; those whose samples were all skipped are not in the manifest."""
    written: int
    """Shards written by this run; the others were finished before."""
    bytes_written: int
    seconds: float
    manifest: str

    def skipped_by_kind(self) -> dict[str, int]:
        """How many inputs were left out for each kind of reason, most first."""
        counts = Counter(row["kind"] for row in self.skipped)
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def summary(self) -> dict[str, Any]:
        """What `--json` prints."""
        return {
            "samples": self.samples,
            "shards": self.shards,
            "skipped": self.skipped,
            "skipped_by_kind": self.skipped_by_kind(),
        }


def default_workers() -> int:
    return usable_cores()


def plan_digest(plan: PackPlan) -> str:
    """The plan's identity: an array task checks that DST was not planned again (--restart)
    since its job was submitted."""
    return hashlib.sha256(plan_bytes(plan)).hexdigest()


def shard_task(plan: PackPlan, src_url: str, dst_url: str, number: int) -> ShardTask:
    """Shard `number` of `plan` as a writer takes it: SRC and DST as URLs it opens itself
    (absolute, with their protocol), and the plan's options."""
    return ShardTask(
        src_url,
        dst_url,
        number,
        tuple(plan.shards[number]),
        clip_seconds=plan.options.clip_seconds,
        audio_stream=plan.options.audio_stream,
    )


def prepare_pack(request: PackRequest) -> PreparedPack:
    """List SRC once; load and check the plan under DST (or make and write it); find the
    finished shards. A manifest left from a complete pack is removed while some shard is
    missing, so that "manifest present" keeps meaning "data set complete"."""
    dst_fs, dst_root, dst_url = open_location(request.dst)
    if dst_fs.isfile(dst_root):
        raise StokerError(f"DST {request.dst!r} is a file", fix="give a folder or prefix")
    listing = list_inputs(request.src, exclude=(dst_fs, dst_root))
    if type(listing.fs) is type(dst_fs) and listing.root == dst_root:
        raise StokerError(
            f"DST {request.dst!r} is SRC: the shards would land among the media",
            fix="write the data set to another folder (a sub-folder of SRC is fine)",
        )
    if request.restart:
        _discard(dst_fs, dst_root)
    plan = _load_or_make_plan(request, listing, dst_fs, dst_root)

    finished = finished_shards(dst_fs, dst_root, range(len(plan.shards)))
    pending = [n for n in range(len(plan.shards)) if n not in finished]
    manifest_path = join(dst_root, MANIFEST_NAME)
    if pending and dst_fs.exists(manifest_path):
        dst_fs.rm(manifest_path)
    return PreparedPack(
        plan=plan,
        src_url=listing.url,
        dst_fs=dst_fs,
        dst_root=dst_root,
        dst_url=dst_url,
        finished=finished,
        pending=pending,
        in_process=process_local(listing.fs) or process_local(dst_fs),
    )


def run_pack(request: PackRequest, progress: PackProgress | None = None) -> PackReport:
    """Pack `request.src` into `request.dst` here (local processes), resuming a previous
    run there."""
    progress = progress or SilentProgress()
    started = time.monotonic()
    prepared = prepare_pack(request)
    planned = len(prepared.plan.shards)
    if prepared.finished:
        progress.note(
            f"resuming: {len(prepared.finished)} of {plural(planned, 'shard')} already written"
        )
    progress.start("writing shards", total=planned, completed=len(prepared.finished))
    tasks = [prepared.task(n) for n in prepared.pending]
    if tasks and prepared.in_process and (request.workers or 1) > 1:
        progress.note("memory:// exists only in this process: packing here, one shard at a time")
    workers = 1 if prepared.in_process else request.workers or default_workers()
    _, failures = run_shard_writers(write_planned_shard, tasks, workers, progress.advance)
    refuse_failures(failures, planned, "written")
    report = finish_pack(request.src, prepared, started)
    if report is None:  # every writer returned, yet a shard is not on storage
        raise StokerError(
            f"the shards of {request.dst} were written but some are not there now",
            fix="run the same command again: it writes what is missing",
        )
    return report


def finalize_pack(dst: str) -> Manifest | None:
    """Write DST's manifest when every planned shard is finished; None while some are not
    (and then nothing is written)."""
    fs, root, _ = open_location(dst)
    plan = load_plan(fs, root)
    if plan is None:
        raise StokerError(f"{dst} holds no {PLAN_NAME}", fix="run `stoker data pack SRC DST`")
    if not _all_listed(fs, root, len(plan.shards)):
        return None  # one listing: array tasks that end before the last read no index
    indexes = finished_shards(fs, root, range(len(plan.shards)))
    if len(indexes) < len(plan.shards):
        return None
    return write_manifest(fs, root, indexes, CREATED_BY)


def finish_pack(src: str, prepared: PreparedPack, started: float) -> PackReport | None:
    """After the writers of `prepared.pending` ended (here, or as a SLURM array): the
    manifest, as `finalize_pack` writes it, and the pack's report; None (no manifest)
    while a shard is missing. `src` is SRC as the user gave it: the report names skipped
    inputs under it."""
    fs, root, plan = prepared.dst_fs, prepared.dst_root, prepared.plan
    # The shards finished before were read by `prepare_pack`: only the new ones now.
    indexes = {**prepared.finished, **finished_shards(fs, root, prepared.pending)}
    if len(indexes) < len(plan.shards):
        return None
    manifest = write_manifest(fs, root, indexes, CREATED_BY)
    skipped = list(plan.skipped)
    for n in range(len(plan.shards)):
        skipped += _read_skipped(fs, root, n)
    return PackReport(
        samples=manifest.samples,
        shards=len(manifest.shards),
        skipped=[
            {"path": join(src, s.path), "reason": s.reason, "kind": s.kind}
            for s in sorted(skipped, key=lambda s: s.path)
        ],
        planned=len(plan.shards),
        written=len(prepared.pending),
        bytes_written=sum(indexes[n].bytes for n in prepared.pending),
        seconds=time.monotonic() - started,
        manifest=join(root, MANIFEST_NAME),
    )


def _all_listed(fs: Any, root: str, count: int) -> bool:
    """Every one of shards 0..count-1 has its tar and its index under `root`."""
    folder = join(root, SHARDS_DIR)
    names = {path.rsplit("/", 1)[-1] for path in fs.find(folder)} if fs.exists(folder) else set()
    tars = [shard_file_name(n) for n in range(count)]
    return all(tar in names and index_name_for(tar) in names for tar in tars)


def _protocols(fs: Any) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def process_local(fs: Any) -> bool:
    """A filesystem that exists only in this process (memory://): no other process can
    write to it."""
    return "memory" in _protocols(fs)


def _discard(fs: Any, root: str) -> None:
    """--restart: remove what a previous pack wrote under DST, and nothing else."""
    for name in (PLAN_NAME, MANIFEST_NAME, SHARDS_DIR, SKIPPED_DIR, WORK_DIR):
        path = join(root, name)
        if fs.exists(path):
            fs.rm(path, recursive=True)


def _load_or_make_plan(request: PackRequest, listing: Listing, fs: Any, root: str) -> PackPlan:
    plan = load_plan(fs, root)
    if plan is not None:
        check_resumable(plan, request.options, listing.files, where=request.dst)
        return plan
    foreign = [n for n in (MANIFEST_NAME, SHARDS_DIR) if fs.exists(join(root, n))]
    if foreign:
        raise StokerError(
            f"DST {request.dst!r} already holds {' and '.join(foreign)} but no {PLAN_NAME}: "
            "it was not written by `stoker data pack`, or its plan was deleted",
            fix="pack into an empty folder, or add --restart to replace what is there",
        )
    plan = make_plan(request.src, listing, request.options)
    fs.makedirs(root, exist_ok=True)
    write_json_atomic(fs, join(root, PLAN_NAME), plan_bytes(plan))
    return plan


def _read_skipped(fs: Any, root: str, number: int) -> list[SkippedInput]:
    path = join(root, skipped_path(number))
    if not fs.exists(path):
        return []
    return [SkippedInput.model_validate(row) for row in json.loads(fs.cat_file(path))]
