"""`stoker data pack`: a folder (or fsspec prefix) of media in, a data set out.

    list SRC once -> plan (DST/pack-plan.json) -> write the missing shards in
    parallel (local processes, or a SLURM array) -> manifest.json from every index

A shard is finished when its index is on storage (the writer puts it after the
tar), so a re-run with the same SRC and options writes only the shards that are
missing and leaves the others untouched. The manifest is written last, and only
when every shard is there: a data set with a manifest is complete.

Local workers are 'forkserver' (or 'spawn') processes, never forked copies of this
one: fsspec's async filesystems (s3fs, gcsfs) are not fork-safe. A
memory:// filesystem exists only in this process, so it is packed here.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from stoker.data.pack_plan import (
    PLAN_NAME,
    Listing,
    PackOptions,
    PackPlan,
    SkippedInput,
    check_resumable,
    list_inputs,
    load_plan,
    make_plan,
    open_location,
    plan_bytes,
)
from stoker.data.pack_write import (
    SKIPPED_DIR,
    ShardResult,
    ShardTask,
    skipped_path,
    write_planned_shard,
)
from stoker.data.shard_format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    build_manifest,
    dump,
    join,
    record_for,
)
from stoker.data.shard_set import finished_shards, read_index, shard_path
from stoker.data.shard_writer import write_json_atomic
from stoker.errors import StokerError

CREATED_BY = "stoker data pack"


class PackProgress(Protocol):
    """Where `run_pack` reports how far it is (the CLI draws a bar from it)."""

    def start(self, description: str, total: int, completed: int = 0) -> None: ...

    def advance(self, amount: int = 1) -> None: ...

    def note(self, message: str) -> None: ...


class SilentProgress:
    def start(self, description: str, total: int, completed: int = 0) -> None:
        pass

    def advance(self, amount: int = 1) -> None:
        pass

    def note(self, message: str) -> None:
        pass


class ShardRunner(Protocol):
    """Runs planned shard writers elsewhere and waits: results and failures by shard."""

    def __call__(
        self,
        tasks: list[ShardTask],
        parallelism: int | None,
        dst_fs: Any,
        dst_root: str,
        advance: Callable[[int], None],
    ) -> tuple[dict[int, ShardResult], dict[int, str]]: ...


@dataclass(frozen=True)
class PackRequest:
    src: str
    dst: str
    options: PackOptions = field(default_factory=PackOptions)
    workers: int | None = None
    """Local processes; with `slurm`, array tasks running at once. None: CPU count
    (with `slurm`: no limit)."""
    restart: bool = False
    """Discard a previous pack under DST (plan, shards, manifest) instead of resuming."""
    runner: ShardRunner | None = None
    """Where the shard writers run instead of local processes (the CLI's --slurm passes
    stoker.launcher.pack_array.SlurmArrayRunner: this package knows nothing of SLURM)."""


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
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def run_pack(request: PackRequest, progress: PackProgress | None = None) -> PackReport:
    """Pack `request.src` into `request.dst`, resuming a previous run there."""
    progress = progress or SilentProgress()
    started = time.monotonic()
    dst_fs, dst_root, dst_url = open_location(request.dst)
    if dst_fs.isfile(dst_root):
        raise StokerError(f"DST {request.dst!r} is a file", fix="give a folder or prefix")
    listing = list_inputs(request.src, exclude=(dst_fs, dst_root))
    if type(listing.fs) is type(dst_fs) and listing.root == dst_root:
        raise StokerError(
            f"DST {request.dst!r} is SRC: the shards would land among the media",
            fix="write the data set to another folder (a sub-folder of SRC is fine)",
        )
    in_process = _process_local(listing.fs) or _process_local(dst_fs)
    if in_process and request.runner is not None:
        raise StokerError(
            "--slurm cannot pack memory://: that filesystem exists only in this process",
            fix="pack to and from storage the SLURM nodes see, or drop --slurm",
        )
    if request.restart:
        _discard(dst_fs, dst_root)
    plan = _load_or_make_plan(request, listing, dst_fs, dst_root)

    finished = finished_shards(dst_fs, dst_root, range(len(plan.shards)))
    pending = [n for n in range(len(plan.shards)) if n not in finished]
    manifest_path = join(dst_root, MANIFEST_NAME)
    if pending and dst_fs.exists(manifest_path):
        dst_fs.rm(manifest_path)  # "manifest present" keeps meaning "data set complete"
    tasks = [
        ShardTask(
            listing.url,
            dst_url,
            n,
            tuple(plan.shards[n]),
            clip_seconds=request.options.clip_seconds,
            audio_stream=request.options.audio_stream,
        )
        for n in pending
    ]
    if finished:
        progress.note(f"resuming: {len(finished)} of {len(plan.shards)} shards already written")
    progress.start("writing shards", total=len(plan.shards), completed=len(finished))
    results, failures = _write_shards(request, tasks, in_process, dst_fs, dst_root, progress)
    if failures:
        lines = "\n".join(f"  {shard_path(n)}: {why}" for n, why in sorted(failures.items()))
        raise StokerError(
            f"{len(failures)} of {len(plan.shards)} shards were not written "
            f"(no {MANIFEST_NAME} yet):\n{lines}",
            fix="fix the cause above and run the same command again: it keeps the "
            f"{len(plan.shards) - len(failures)} finished shards and writes the rest",
        )

    indexes = {**finished, **{n: read_index(dst_fs, dst_root, n) for n in results}}
    numbers = [n for n in sorted(indexes) if indexes[n].samples]  # a shard may lose all
    records = [record_for(indexes[n], shard_path(n)) for n in numbers]
    manifest = build_manifest(records, [indexes[n] for n in numbers], created_by=CREATED_BY)
    write_json_atomic(dst_fs, manifest_path, dump(manifest))

    skipped = list(plan.skipped)
    for n in range(len(plan.shards)):
        skipped += results[n].skipped if n in results else _read_skipped(dst_fs, dst_root, n)
    return PackReport(
        samples=manifest.samples,
        shards=len(manifest.shards),
        skipped=[
            {"path": join(request.src, s.path), "reason": s.reason, "kind": s.kind}
            for s in sorted(skipped, key=lambda s: s.path)
        ],
        planned=len(plan.shards),
        written=len(results),
        bytes_written=sum(r.bytes for r in results.values()),
        seconds=time.monotonic() - started,
        manifest=manifest_path,
    )


def _protocols(fs: Any) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def _write_shards(
    request: PackRequest,
    tasks: list[ShardTask],
    in_process: bool,
    dst_fs: Any,
    dst_root: str,
    progress: PackProgress,
) -> tuple[dict[int, ShardResult], dict[int, str]]:
    """Results and failures by shard number, from a SLURM array or local processes."""
    if not tasks:
        return {}, {}
    if request.runner is not None:
        return request.runner(tasks, request.workers, dst_fs, dst_root, progress.advance)
    if in_process and (request.workers or 1) > 1:
        progress.note("memory:// exists only in this process: packing here, one shard at a time")
    workers = 1 if in_process else request.workers or default_workers()
    return _run_local(tasks, workers, progress.advance)


def _process_local(fs: Any) -> bool:
    return "memory" in _protocols(fs)


def _discard(fs: Any, root: str) -> None:
    """--restart: remove what a previous pack wrote under DST, and nothing else."""
    for name in (PLAN_NAME, MANIFEST_NAME, SHARDS_DIR, SKIPPED_DIR):
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


def _run_local(
    tasks: list[ShardTask], workers: int, advance: Callable[[], None]
) -> tuple[dict[int, ShardResult], dict[int, str]]:
    """Write `tasks` with `workers` processes (here, when 1); failures by shard."""
    results: dict[int, ShardResult] = {}
    failures: dict[int, str] = {}
    if workers <= 1 or len(tasks) == 1:
        for task in tasks:
            try:
                results[task.number] = write_planned_shard(task)
            except Exception as exc:  # reported with the shard; the others go on
                failures[task.number] = f"{type(exc).__name__}: {exc}"
            advance()
        return results, failures

    from concurrent.futures import ProcessPoolExecutor, as_completed

    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    with ProcessPoolExecutor(min(workers, len(tasks)), mp_context=context) as pool:
        futures = {pool.submit(write_planned_shard, task): task.number for task in tasks}
        for future in as_completed(futures):
            number = futures[future]
            try:
                results[number] = future.result()
            except Exception as exc:  # a worker that died fails its shards, not the pack
                failures[number] = f"{type(exc).__name__}: {exc}"
            advance()
    return results, failures
