"""The plan of a `stoker data encode`: DST/encode-plan.json, written before any shard.

It says what DST is the latents of: the source data set (its URL and the SHA-256 of
its manifest), the encoder's identity, and the decode settings. A re-run into the
same DST must agree on all three, or it is refused: latents of another encoder, of
another version of the source, or decoded at other sizes must never be mixed into
one data set. Output shard n holds the latents of source shard n.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from stoker.data.encode.shard import DecodeSpec, EncodeTask
from stoker.data.format.latent_format import (
    BucketRecord,
    DecodeRecord,
    EncoderIdentity,
    SourceRecord,
)
from stoker.data.format.shard_format import MANIFEST_NAME, SHARDS_DIR, join
from stoker.data.sets.buckets import Bucket
from stoker.data.write.shard_writer import write_json_atomic
from stoker.errors import StokerError

PLAN_NAME = "encode-plan.json"


class EncodePlan(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["stoker-encode-plan"] = "stoker-encode-plan"
    version: int = 1
    source: SourceRecord
    encoder: EncoderIdentity
    decode: DecodeRecord
    shards: int
    """Source shards, each encoded into the output shard of the same number."""


def decode_record(spec: DecodeSpec) -> DecodeRecord:
    return DecodeRecord(
        modalities=list(spec.modalities),
        fps=spec.fps,
        resolution=spec.resolution,
        clip_seconds=spec.clip_seconds,
        sample_rate=spec.sample_rate,
        channels=spec.channels,
        resize=spec.resize,
        buckets=[
            BucketRecord(name=b.name, resolution=b.resolution, clip_seconds=b.clip_seconds)
            for b in spec.buckets
        ],
    )


def decode_spec(record: DecodeRecord) -> DecodeSpec:
    return DecodeSpec(
        modalities=tuple(record.modalities),
        fps=record.fps,
        resolution=record.resolution,
        clip_seconds=record.clip_seconds,
        sample_rate=record.sample_rate,
        channels=record.channels,
        resize=record.resize,
        buckets=tuple(Bucket(b.resolution, b.clip_seconds, 1) for b in record.buckets),
    )


def source_record(url: str, raw_manifest: bytes, manifest: Any, origin: str = "") -> SourceRecord:
    return SourceRecord(
        url=url,
        manifest_sha256=hashlib.sha256(raw_manifest).hexdigest(),
        samples=manifest.samples,
        created_by=manifest.created_by,
        origin=origin,
        encoding=manifest.encoding,
    )


def pack_origin(fs: Any, root: str) -> str:
    """The SRC a packed data set at `root` was packed from (its pack-plan.json says, as
    given to `stoker data pack`), or "" when it was not packed there or does not say."""
    try:
        return str(json.loads(fs.cat_file(join(root, "pack-plan.json"))).get("src", ""))
    except (OSError, ValueError, AttributeError):
        return ""


def load_plan(fs: Any, root: str) -> EncodePlan | None:
    path = join(root, PLAN_NAME)
    if not fs.exists(path):
        return None
    try:
        return EncodePlan.model_validate(json.loads(fs.cat_file(path)))
    except (ValueError, ValidationError) as exc:
        raise StokerError(
            f"{path} is not an encode plan stoker reads ({exc})",
            fix="encode into another folder, or add --restart to start this one again",
        ) from exc


def write_plan(fs: Any, root: str, plan: EncodePlan) -> None:
    fs.makedirs(root, exist_ok=True)
    body = json.dumps(plan.model_dump(mode="json"), indent=1) + "\n"
    write_json_atomic(fs, join(root, PLAN_NAME), body.encode())


def check_same_encode(old: EncodePlan, new: EncodePlan, dst: str) -> None:
    """A re-run into `dst` must be the same encode: refused, naming what differs."""
    fix = (
        f"encode into another folder (latents of two encodes never share one), or add "
        f"--restart to discard what {dst} holds and encode it again"
    )
    if old.encoder.digest != new.encoder.digest:
        changed = [
            name
            for name in ("factory", "args", "code_sha256", "weights_sha256", "version")
            if getattr(old.encoder, name) != getattr(new.encoder, name)
        ]
        raise StokerError(
            f"{dst} holds latents of another encoder: {old.encoder.factory} "
            f"(identity {old.encoder.digest[:12]}), not {new.encoder.factory} "
            f"(identity {new.encoder.digest[:12]}); what differs: {', '.join(changed)}",
            fix=fix,
        )
    if old.source.manifest_sha256 != new.source.manifest_sha256:
        raise StokerError(
            f"{dst} holds latents of another source: {old.source.url} (manifest "
            f"{old.source.manifest_sha256[:12]}), not {new.source.url} (manifest "
            f"{new.source.manifest_sha256[:12]})",
            fix=fix,
        )
    if old.decode != new.decode:
        raise StokerError(
            f"{dst} holds latents decoded with other settings: {_diff(old.decode, new.decode)}",
            fix=fix,
        )


def _diff(old: DecodeRecord, new: DecodeRecord) -> str:
    a, b = old.model_dump(), new.model_dump()
    return "; ".join(f"{k} {a[k]} then, {b[k]} now" for k in a if a[k] != b[k])


def check_foreign(fs: Any, root: str, dst: str) -> None:
    """DST without a plan must hold no data set: refuse to write into one."""
    foreign = [n for n in (MANIFEST_NAME, SHARDS_DIR) if fs.exists(join(root, n))]
    if foreign:
        raise StokerError(
            f"DST {dst!r} already holds {' and '.join(foreign)} but no {PLAN_NAME}: it was "
            "not written by `stoker data encode`",
            fix="encode into an empty folder, or add --restart to replace what is there",
        )


def shard_task(
    plan: EncodePlan, dst_url: str, number: int, *, batch_size: int, device: str | None
) -> EncodeTask:
    """The work of encoding source shard `number` as `plan` says."""
    return EncodeTask(
        src_url=plan.source.url,
        dst_url=dst_url,
        number=number,
        factory=plan.encoder.factory,
        args=tuple(plan.encoder.args.items()),
        identity_digest=plan.encoder.digest,
        decode=decode_spec(plan.decode),
        batch_size=batch_size,
        device=device,
    )
