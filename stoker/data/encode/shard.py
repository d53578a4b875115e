"""Encode one shard of a data set: decode its samples at their bucket's shape, run the
encoder on batches of one bucket, write `<key>.latent.safetensors` (plus the caption
and metadata passed through) into shard n of the destination, the same number as the
source shard it comes from.

Runs in a worker process or a SLURM array task: everything it needs travels in an
`EncodeTask`, and it builds the encoder itself, once per process (the factory is
imported by name). A sample that does not decode, or that the encoder fails on alone,
is left out and reported; an encoder that fails on every sample, returns something
other than B-row tensors, or changes a tensor's shape or dtype within a bucket stops
the shard with a StokerError (that is the encoder's bug, not the data's). The skip
report goes to DST/encode-skipped/ before the tar, as `data pack` does.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stoker.data.format.latent_format import LATENT_MEMBER, LATENT_VERSION, LatentEntry, TensorInfo
from stoker.data.format.shard_format import (
    CAPTION_EXT,
    METADATA_EXT,
    SampleEntry,
    join,
    shard_file_name,
)
from stoker.data.sets.buckets import Bucket, assign_bucket
from stoker.data.write.location import open_location
from stoker.data.write.shard_set import shard_path
from stoker.data.write.shard_writer import SampleToWrite, write_json_atomic, write_shard
from stoker.errors import StokerError
from stoker.import_path import last_frame

log = logging.getLogger("stoker.data")

SKIPPED_DIR = "encode-skipped"
FAIL_FAST = 8
"""Samples the encoder may fail on, none succeeding, before it is taken for broken."""


@dataclass(frozen=True)
class DecodeSpec:
    """How source samples become the encoder's input (data.* settings of the encode)."""

    modalities: tuple[str, ...]
    fps: float
    resolution: tuple[int, int]
    clip_seconds: float
    sample_rate: int
    channels: int
    resize: str
    buckets: tuple[Bucket, ...] = ()

    def shape_of(self, entry: SampleEntry) -> tuple[str | None, tuple[int, int], float]:
        """(bucket name or None, resolution, clip_seconds) the sample is decoded at."""
        if not self.buckets:
            return None, self.resolution, self.clip_seconds
        bucket = self.buckets[assign_bucket(entry, self.buckets, video="video" in self.modalities)]
        return bucket.name, bucket.resolution, bucket.clip_seconds


@dataclass(frozen=True)
class EncodeTask:
    """One shard to encode; pickled to a worker process (or read by an array task)."""

    src_url: str
    dst_url: str
    number: int
    """The source shard's place in its manifest, and the output shard's number."""
    factory: str
    args: tuple[tuple[str, str], ...]
    identity_digest: str
    """The plan's encoder identity: a process whose encoder differs stops (code changed)."""
    decode: DecodeSpec
    batch_size: int
    device: str | None = None


@dataclass
class EncodeResult:
    number: int
    samples: int
    bytes: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    """{"key", "shard", "reason"} of each sample left out."""
    encode_s: float = 0.0
    """Seconds in the encoder (the rest is read, decode and write)."""
    gpu_util: list[float] = field(default_factory=list)
    """On a GPU: its utilisation (%, NVML) after each encoder call; empty elsewhere."""


def skipped_path(number: int) -> str:
    return f"{SKIPPED_DIR}/{shard_file_name(number).removesuffix('.tar')}.json"


# One encoder per process and (factory, args): building it may load gigabytes.
_ENCODERS: dict[tuple[str, tuple[tuple[str, str], ...], str | None], Any] = {}


def _encoder_for(task: EncodeTask) -> Any:
    from stoker.data.encode.encoder_api import load_encoder

    key = (task.factory, task.args, task.device)
    if key not in _ENCODERS:
        loaded = load_encoder(task.factory, dict(task.args), device=task.device)
        if loaded.identity.digest != task.identity_digest:
            raise StokerError(
                f"the encoder {task.factory} here has identity {loaded.identity.digest[:12]}, "
                f"not {task.identity_digest[:12]} as when the encode was planned: its code, "
                "weights or arguments changed since",
                fix="run the encode again from the start with --restart (or into a new "
                "folder), so that every shard comes from one encoder",
            )
        _ENCODERS[key] = loaded
    return _ENCODERS[key]


class _Tracker:
    """Shapes and dtypes per bucket (the first batch fixes them), and fail-fast counts."""

    def __init__(self) -> None:
        self.shapes: dict[str | None, dict[str, TensorInfo]] = {}
        self.encoded = 0
        self.failed = 0

    def check(self, bucket: str | None, tensors: Mapping[str, TensorInfo], key: str) -> None:
        first = self.shapes.setdefault(bucket, dict(tensors))
        if first != dict(tensors):
            raise StokerError(
                f"the encoder's output changed within bucket {bucket or '(the one shape)'}: "
                f"sample {key!r} gave {_describe(tensors)}, earlier samples "
                f"{_describe(first)}",
                fix="return tensors of one shape and dtype for every clip of one shape "
                "(pad or crop inside the encoder)",
            )


def _describe(tensors: Mapping[str, TensorInfo]) -> str:
    return ", ".join(f"{n} {list(t.shape)} {t.dtype}" for n, t in sorted(tensors.items()))


def encode_shard(task: EncodeTask, stop: Callable[[], bool] = lambda: False) -> EncodeResult:
    """Encode shard `task.number` into DST; `stop()` is asked between batches (a
    preempted array task stops there: a half-built shard is never written)."""
    from stoker.data.sets.dataset import open_dataset

    loaded = _encoder_for(task)
    source = open_dataset(task.src_url)
    dst_fs, dst_root, _ = open_location(task.dst_url)
    index = source.read_index(task.number)
    blob = source.fs.cat_file(source.shard_path(task.number))
    tracker = _TRACKERS.setdefault((task.dst_url, task.identity_digest, task.decode), _Tracker())

    skipped: list[dict[str, str]] = []
    shard_name = source.manifest.shards[task.number].path
    decoded: dict[str, dict[str, Any]] = {}
    groups: dict[str | None, list[SampleEntry]] = {}
    for entry in index.samples:
        bucket, resolution, seconds = task.decode.shape_of(entry)
        try:
            decoded[entry.key] = _decode(entry, blob, task.decode, resolution, seconds)
        except ValueError as exc:
            skipped.append({"key": entry.key, "shard": shard_name, "reason": str(exc)})
            continue
        groups.setdefault(bucket, []).append(entry)

    latents: dict[str, tuple[bytes, LatentEntry]] = {}
    encode_s = 0.0
    gpu_util: list[float] = []
    for bucket, entries in groups.items():
        seconds = task.decode.shape_of(entries[0])[2]
        for start in range(0, len(entries), task.batch_size):
            if stop():
                raise InterruptedError(f"stopped before shard {task.number} was finished")
            chunk = entries[start : start + task.batch_size]
            began = time.perf_counter()
            rows = _encode_rows(loaded, [decoded[e.key] for e in chunk], tracker, chunk)
            encode_s += time.perf_counter() - began
            busy = _gpu_utilisation(loaded.device)
            if busy is not None:
                gpu_util.append(busy)
            for entry, row in zip(chunk, rows, strict=True):
                if isinstance(row, str):
                    skipped.append({"key": entry.key, "shard": shard_name, "reason": row})
                    continue
                infos = {
                    n: TensorInfo(shape=tuple(t.shape), dtype=_dtype(t)) for n, t in row.items()
                }
                tracker.check(bucket, infos, entry.key)
                latents[entry.key] = (
                    _save(row),
                    LatentEntry(bucket=bucket, clip_seconds=seconds, tensors=infos),
                )

    samples = []
    for entry in index.samples:  # the source's order
        if entry.key not in latents:
            continue
        data, latent = latents[entry.key]
        members = {LATENT_MEMBER: data}
        for ext in (CAPTION_EXT, METADATA_EXT):
            if ext in entry.members:
                members[ext] = _member(blob, entry, ext)
        samples.append(SampleToWrite(key=entry.key, members=members, latent=latent))
    report = join(dst_root, skipped_path(task.number))
    dst_fs.makedirs(report.rsplit("/", 1)[0], exist_ok=True)
    write_json_atomic(dst_fs, report, (json.dumps(skipped, indent=1) + "\n").encode())
    written = write_shard(
        dst_fs, join(dst_root, shard_path(task.number)), samples, version=LATENT_VERSION
    )
    return EncodeResult(
        task.number, len(written.samples), written.bytes, skipped, encode_s, gpu_util
    )


def _gpu_utilisation(device: str) -> float | None:
    """The GPU's busy share (%) over NVML's last sample period, or None off a GPU (or
    without pynvml)."""
    if not device.startswith("cuda"):
        return None
    import torch

    try:
        return float(torch.cuda.utilization(torch.device(device)))
    except Exception:  # no pynvml, or NVML refused: the figure is optional
        return None


# One tracker per encode this process takes part in: its destination, encoder and decode
# settings. Another encode in the same process (the Python API, a test's, one run again
# with --restart and other data.* settings) starts its own shapes.
_TRACKERS: dict[tuple[str, str, DecodeSpec], _Tracker] = {}


def _member(blob: bytes, entry: SampleEntry, ext: str) -> bytes:
    member = entry.members[ext]
    return blob[member.offset : member.offset + member.size]


def _decode(
    entry: SampleEntry,
    blob: bytes,
    spec: DecodeSpec,
    resolution: tuple[int, int],
    clip_seconds: float,
) -> dict[str, Any]:
    """The encoder's input for one sample, from its clip's start; a ValueError (the
    reason) when a member is missing or does not decode."""
    import torch

    from stoker.data.media.decode import decode_audio, decode_video
    from stoker.data.media.errors import MediaError

    sample: dict[str, Any] = {"key": entry.key}
    try:
        if entry.error is not None and entry.unreadable(spec.modalities):
            raise MediaError(entry.error)
        if "video" in spec.modalities:
            if entry.video is None:
                raise ValueError("no video")
            video = decode_video(
                _member(blob, entry, entry.video.field),
                fps=spec.fps,
                size=resolution,
                resize=spec.resize,  # type: ignore[arg-type]
                start_s=0.0,
                clip_seconds=clip_seconds,
                info=entry.video,
            )
            sample["video"] = torch.from_numpy(video)
        if "audio" in spec.modalities:
            if entry.audio is None:
                raise ValueError("no audio")
            audio = decode_audio(
                _member(blob, entry, entry.audio.field),
                field=entry.audio.field,
                sample_rate=spec.sample_rate,
                channels=spec.channels,
                start_s=0.0,
                clip_seconds=clip_seconds,
                info=entry.audio,
            )
            sample["audio"] = torch.from_numpy(np.ascontiguousarray(audio))
        if "text" in spec.modalities:
            sample["text"] = _member(blob, entry, CAPTION_EXT).decode("utf-8", errors="replace")
    except (MediaError, KeyError) as exc:
        raise ValueError(f"does not decode: {exc}") from exc
    return sample


def _encode_rows(
    loaded: Any, samples: list[dict[str, Any]], tracker: _Tracker, entries: list[SampleEntry]
) -> list[dict[str, Any] | str]:
    """Each sample's tensors (CPU, contiguous), or why the encoder failed on it. A failed
    batch is retried a sample at a time, so one bad clip costs only itself."""
    try:
        out = _call(loaded, samples)
    except StokerError:
        raise
    except Exception as exc:
        if len(samples) == 1:
            tracker.failed += 1
            fail_fast_check(tracker, exc)
            reason = f"the encoder raised {type(exc).__name__}: {exc} [{last_frame(exc)}]"
            log.warning("stoker.data: skipping sample %r: %s", entries[0].key, reason)
            return [reason]
        rows: list[dict[str, Any] | str] = []
        for sample, entry in zip(samples, entries, strict=True):
            rows += _encode_rows(loaded, [sample], tracker, [entry])
        return rows
    tracker.encoded += len(samples)
    return [{name: t[i].clone() for name, t in out.items()} for i in range(len(samples))]


def _call(loaded: Any, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The encoder on one batch: its outputs on the CPU; a StokerError for output that
    breaks the contract (the same for every batch: fatal)."""
    import torch

    batch: dict[str, Any] = {}
    for name in samples[0]:
        values = [s[name] for s in samples]
        if isinstance(values[0], torch.Tensor):
            batch[name] = torch.stack(values).to(loaded.device)
        else:
            batch[name] = values
    with torch.inference_mode():
        out = loaded.encoder(batch)
    where = f"--encoder {loaded.identity.factory}"
    if not isinstance(out, Mapping) or not out:
        raise StokerError(
            f"{where} returned {type(out).__name__}, not a dict of tensors by name",
            fix="return {'video': tensor [B, ...], ...}: one row per sample of the batch",
        )
    rows = len(samples)
    result = {}
    for name, tensor in out.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise StokerError(
                f"{where} returned a tensor named {name!r}", fix="name tensors like variables"
            )
        if not isinstance(tensor, torch.Tensor) or tensor.dim() < 1 or tensor.shape[0] != rows:
            shape = (
                list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            )
            raise StokerError(
                f"{where} returned {name!r} as {shape} for a batch of {rows}",
                fix="return one row per sample: a tensor of shape [B, ...]",
            )
        result[name] = tensor.detach().to("cpu").contiguous()
    return result


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _save(tensors: dict[str, Any]) -> bytes:
    from safetensors.torch import save

    data: bytes = save({name: t.contiguous() for name, t in tensors.items()})
    return data


def fail_fast_check(tracker: _Tracker, exc: BaseException) -> None:
    """Stop an encoder that has failed on FAIL_FAST samples and succeeded on none."""
    if tracker.encoded == 0 and tracker.failed >= FAIL_FAST:
        raise StokerError(
            f"the encoder failed on each of the first {tracker.failed} samples, the last "
            f"with {type(exc).__name__}: {exc} [{last_frame(exc)}]",
            fix="fix the encoder (it fails on every clip, so the error is in it, not in the "
            "data), then run the same command again",
        ) from exc
