"""`stoker data encode SRC DST --encoder pkg.mod:factory`: latents of a data set, once.

    plan (DST/encode-plan.json: source, encoder identity, decode settings)
      -> encode the shards not finished yet (here, in processes, or as a SLURM array)
      -> manifest.json, once every shard is there (`finalize`)

Output shard n holds the latents of source shard n, so a re-run (or a requeued array
task) encodes only the shards whose index is missing, and `finalize` may run in
whichever process finishes last: the manifest it writes is a function of the shards
alone, so two that race write the same bytes.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from stoker.data.encode.plan import (
    PLAN_NAME,
    EncodePlan,
    check_foreign,
    check_same_encode,
    decode_record,
    load_plan,
    pack_origin,
    shard_task,
    source_record,
    write_plan,
)
from stoker.data.encode.shard import (
    SKIPPED_DIR,
    DecodeSpec,
    EncodeTask,
    encode_shard,
    skipped_path,
)
from stoker.data.format.latent_format import EncodingRecord, TensorInfo
from stoker.data.format.shard_format import (
    MANIFEST_NAME,
    SHARDS_DIR,
    Manifest,
    ShardIndex,
    join,
)
from stoker.data.write.location import open_location
from stoker.data.write.shard_pool import SilentProgress, refuse_failures, run_shard_writers
from stoker.data.write.shard_set import finished_shards, write_manifest
from stoker.errors import StokerError
from stoker.plural import plural

CREATED_BY = "stoker data encode"
WORK_DIR = "encode-work"


@dataclass(frozen=True)
class EncodeRequest:
    src: str
    dst: str
    factory: str
    """The encoder factory's import path (`--encoder`)."""
    args: dict[str, str] = field(default_factory=dict)
    decode: DecodeSpec = field(
        default_factory=lambda: DecodeSpec(("video", "audio"), 8, (64, 64), 1.0, 16000, 1, "crop")
    )
    batch_size: int = 8
    workers: int = 1
    """Local processes, each with its own encoder (on a GPU: one per GPU, or 1)."""
    restart: bool = False
    device: str | None = None


@dataclass
class Prepared:
    """An encode planned under DST: what is finished and what is left."""

    plan: EncodePlan
    dst_fs: Any
    dst_root: str
    dst_url: str
    finished: dict[int, ShardIndex]
    pending: list[int]

    def task(self, request: EncodeRequest, number: int) -> EncodeTask:
        return shard_task(
            self.plan, self.dst_url, number, batch_size=request.batch_size, device=request.device
        )


@dataclass
class EncodeReport:
    samples: int
    shards: int
    skipped: list[dict[str, str]]
    """{"key", "shard", "reason"} of each source sample left out."""
    planned: int
    written: int
    """Shards encoded by this run; the others were finished before."""
    seconds: float
    encode_seconds: float
    """Of `seconds`, spent inside the encoder."""
    encoded_samples: int
    """Samples encoded by this run."""
    manifest: str
    identity: str
    gpu_util: float | None = None
    """Mean GPU utilisation (%) after the encoder's calls, on a GPU; None elsewhere."""

    @property
    def clips_per_s(self) -> float:
        return self.encoded_samples / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> dict[str, Any]:
        """What `--json` prints."""
        return {
            "samples": self.samples,
            "shards": self.shards,
            "written": self.written,
            "skipped": self.skipped,
            "clips_per_s": round(self.clips_per_s, 3),
            "encoder_busy": round(self.encode_seconds / self.seconds, 3) if self.seconds else 0,
            "gpu_util": self.gpu_util,
            "manifest": self.manifest,
            "encoder_identity": self.identity,
        }


def prepare(request: EncodeRequest) -> Prepared:
    """Check SRC, DST and the encoder; write (or check) the plan; find finished shards."""
    from stoker.data.encode.encoder_api import identify_encoder
    from stoker.data.sets.dataset import open_dataset

    source = open_dataset(request.src)
    if source.indexes is not None:
        raise StokerError(
            f"SRC {request.src!r} is plain WebDataset shards without a manifest",
            fix="pack it first (`stoker data pack`): an encode is keyed by the source's manifest",
        )
    missing = [m for m in request.decode.modalities if m not in source.manifest.modalities]
    if missing:
        raise StokerError(
            f"SRC {request.src!r} lacks {', '.join(missing)} in some samples (it has "
            f"{', '.join(source.manifest.modalities)})",
            fix="encode only what it has: data.modalities=[...]",
        )
    dst_fs, dst_root, dst_url = open_location(request.dst)
    src_fs, src_root, src_url = open_location(request.src)
    if type(src_fs) is type(dst_fs) and src_root == dst_root:
        raise StokerError(f"DST {request.dst!r} is SRC", fix="write the latents to another folder")
    raw = source.fs.cat_file(join(source.root, MANIFEST_NAME))
    _, identity = identify_encoder(request.factory, request.args)
    plan = EncodePlan(
        source=source_record(src_url, raw, source.manifest, pack_origin(source.fs, source.root)),
        encoder=identity,
        decode=decode_record(request.decode),
        shards=len(source.manifest.shards),
    )
    if request.restart:
        for name in (PLAN_NAME, MANIFEST_NAME, SHARDS_DIR, SKIPPED_DIR, WORK_DIR):
            if dst_fs.exists(join(dst_root, name)):
                dst_fs.rm(join(dst_root, name), recursive=True)
    old = load_plan(dst_fs, dst_root)
    if old is None:
        check_foreign(dst_fs, dst_root, request.dst)
        write_plan(dst_fs, dst_root, plan)
    else:
        check_same_encode(old, plan, request.dst)
        plan = old
    finished = finished_shards(dst_fs, dst_root, range(plan.shards))
    pending = [n for n in range(plan.shards) if n not in finished]
    manifest_path = join(dst_root, MANIFEST_NAME)
    if pending and dst_fs.exists(manifest_path):
        dst_fs.rm(manifest_path)  # "manifest present" keeps meaning "data set complete"
    return Prepared(plan, dst_fs, dst_root, dst_url, finished, pending)


def run_encode(
    request: EncodeRequest,
    progress: Any = None,
) -> EncodeReport:
    """Encode `request.src` into `request.dst` here (processes), resuming what is there."""
    progress = progress or SilentProgress()
    started = time.monotonic()
    prepared = prepare(request)
    if prepared.finished:
        progress.note(
            f"resuming: {len(prepared.finished)} of {plural(prepared.plan.shards, 'shard')} "
            "already encoded"
        )
    progress.start("encoding shards", total=prepared.plan.shards, completed=len(prepared.finished))
    tasks = [prepared.task(request, n) for n in prepared.pending]
    results, failures = run_shard_writers(
        encode_shard, tasks, request.workers, progress.advance, fatal=(StokerError,)
    )
    refuse_failures(failures, prepared.plan.shards, "encoded")
    manifest = finalize(request.dst)
    assert manifest is not None  # every shard is there
    return EncodeReport(
        samples=manifest.samples,
        shards=len(manifest.shards),
        skipped=read_skipped(prepared.dst_fs, prepared.dst_root, prepared.plan.shards),
        planned=prepared.plan.shards,
        written=len(results),
        seconds=time.monotonic() - started,
        encode_seconds=sum(r.encode_s for r in results.values()),
        encoded_samples=sum(r.samples for r in results.values()),
        gpu_util=_mean([u for r in results.values() for u in r.gpu_util]),
        manifest=join(prepared.dst_root, MANIFEST_NAME),
        identity=prepared.plan.encoder.digest,
    )


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 1) if values else None


def finalize(dst: str) -> Manifest | None:
    """Write DST's manifest when every planned shard is encoded (None while some are
    not): the shapes of each bucket checked to agree across shards."""
    fs, root, _ = open_location(dst)
    plan = load_plan(fs, root)
    if plan is None:
        raise StokerError(f"{dst} holds no {PLAN_NAME}", fix="run `stoker data encode` first")
    finished = finished_shards(fs, root, range(plan.shards))
    if len(finished) < plan.shards:
        return None
    numbers = [n for n in sorted(finished) if finished[n].samples]
    shapes = _bucket_shapes([finished[n] for n in numbers], dst)
    encoding = EncodingRecord(
        encoder=plan.encoder, source=plan.source, decode=plan.decode, shapes=shapes
    )
    return write_manifest(fs, root, finished, CREATED_BY, encoding)


def _bucket_shapes(indexes: list[ShardIndex], dst: str) -> dict[str, dict[str, TensorInfo]]:
    shapes: dict[str, dict[str, TensorInfo]] = {}
    where: dict[str, str] = {}
    for index in indexes:
        for sample in index.samples:
            assert sample.latent is not None
            bucket = sample.latent.bucket or ""
            first = shapes.setdefault(bucket, sample.latent.tensors)
            where.setdefault(bucket, f"{index.shard}:{sample.key}")
            if first != sample.latent.tensors:
                raise StokerError(
                    f"{dst}: the encoder's output differs within bucket {bucket or '(one shape)'}:"
                    f" {where[bucket]} has {_shapes(first)}, {index.shard}:{sample.key} "
                    f"{_shapes(sample.latent.tensors)}",
                    fix="an encoder must give one shape and dtype per bucket; fix it and "
                    "encode again with --restart",
                )
    return shapes


def _shapes(tensors: dict[str, TensorInfo]) -> str:
    return ", ".join(f"{n} {list(t.shape)} {t.dtype}" for n, t in sorted(tensors.items()))


def read_skipped(fs: Any, root: str, shards: int) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for n in range(shards):
        path = join(root, skipped_path(n))
        if fs.exists(path):
            rows += json.loads(fs.cat_file(path))
    return rows


def skipped_by_reason(rows: list[dict[str, str]]) -> dict[str, int]:
    counts = Counter(row["reason"].split(":")[0] for row in rows)
    return dict(counts.most_common())
